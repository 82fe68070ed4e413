"""Generate: vLLM and OpenAI-compatible deployments with fallback and breakers (`deployments`,
`attempts`), streaming (`stream`), fair batching (`fair_gate`, `coalesce`), LoRA (`lora/`), RL
rollouts (`rollouts/`), the actor revision (`actor`)."""
