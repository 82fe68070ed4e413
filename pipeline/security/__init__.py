"""Cross-cutting protections: `caller_assertion` (signed principal claims), `sealing` (PII vault
sealing), `stream_unmask` (un-masking streamed deltas without splitting a placeholder)."""
