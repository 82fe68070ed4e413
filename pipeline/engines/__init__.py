"""Model engines behind small interfaces: text embeddings (and, later, LLM and vision engines)."""
