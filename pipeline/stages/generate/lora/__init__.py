"""Multi-LoRA: which adapters an engine holds (`residency`, `host`) and when a request's adapter is
refused (`refusal`)."""
