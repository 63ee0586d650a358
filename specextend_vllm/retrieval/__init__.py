"""Cross-model retrieval: the target's final-layer attention scores the draft's chunks
(`scoring`), the planner decides each step which requests select, what they keep and
where the draft's reduced block table points (`planner`), and kept chunks are packed
into working copies where the draft reads them there (`working_copies`)."""
