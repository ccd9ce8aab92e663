"""radixflow.frontend: HTTP serving (OpenAI and SGLang-native APIs, programs, metrics) and the CLI."""
