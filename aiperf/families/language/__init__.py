"""The language-model family: decoder-only transformers trained on tokens (docs/llm.md)."""
