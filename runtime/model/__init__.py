"""radixflow.runtime.model: The model: config, layers, attention, checkpoint loading (safetensors, GGUF), demo and default models."""
