"""Runtime seams: changes the proposer makes, once the models are loaded, to vLLM objects
it holds (a layer's attention, the draft's rotary table). Unlike `patches`, nothing here
is installed at plugin load or registered."""
