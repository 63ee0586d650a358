"""Every change the plugin makes to vLLM, grouped by the vLLM subsystem it touches
(config, runner, scheduler, sampler, metrics; attention and model for the per-layer
and per-model changes made when the models load). `registry.apply_all()` installs the
declarative patches in one ordered list."""
