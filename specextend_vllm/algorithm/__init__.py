"""The method's algorithm in pure torch, with no vLLM import: chunk selection and when to
select (selection, triggers, retrieval_state), compact-position math (positions), the
per-step batch view they work on (draft_step) and speculative-sampling helpers (sampling).
Every function works on whole batches, one row per request."""
