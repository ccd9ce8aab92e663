"""radixflow.runtime.core: What runs in the engine loop: scheduler and policy, pools, the step, model runner, sampler, CUDA graphs."""
