"""radixflow.runtime.text: Text handling: tokenizers (HF and GGUF), incremental detokenizer, role markers, stop strings."""
