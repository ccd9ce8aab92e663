"""Multi-LoRA serving: PEFT adapters, their device slots, batched deltas, and the engine's registry."""
