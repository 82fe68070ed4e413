"""The generate stage's policy model (parse-only): token limits, the deployment order when route
names none, retries and the circuit breaker, how adapters share an engine, how streamed answers are
coalesced and sealed, and the rollout hooks a request may name (rollouts/hooks.py checks those)."""

from __future__ import annotations

from pydantic import Field

from pipeline.config.policy import PolicyModel
from pipeline.stages.generate.rollouts.hooks import RolloutHooks


class RetryPolicy(PolicyModel):
    # an HTTP deployment: the attempt's limit; in-process vLLM: how long the whole engine may produce
    # nothing before the attempt fails (it is otherwise bounded by the deadline: a busy engine is no failure)
    attempt_timeout_ms: int = 30_000
    backoff_base_ms: int = 200
    backoff_max_ms: int = 5_000
    fallback_reserve_ms: int = 2_000
    max_attempts: int = 3


class BreakerPolicy(PolicyModel):
    failures_to_open: int = 5
    window_ms: int = 30_000
    cooldown_ms: int = 15_000


class StreamPolicy(PolicyModel):
    window_ms: float = Field(25.0, gt=0, description="the worker's streams flush together at most once per window "
                                                     "while tokens come faster; no piece waits longer")
    max_tokens: int = Field(16, ge=1, description="an attempt's delta goes once this many tokens wait, window or not")
    seal: bool = Field(True, description="seal each delta's text, tokens and logprobs under the request's key: a "
                                         "reader of `deltas` sees ids, sizes and times only (about 15 us a delta). "
                                         "Off: every reader of a partition reads every answer streamed through it")


class GeneratePolicy(PolicyModel):
    version: str = "generate-v2"
    default_max_tokens: int = Field(128, ge=1)
    max_tokens_cap: int = Field(512, ge=1)
    prefer: list[str] = Field(default_factory=list, description="deployment order when route names none")
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    breaker: BreakerPolicy = Field(default_factory=BreakerPolicy)
    adapter_token_budget: int = Field(2048, ge=1, description="tokens (prompt + max_tokens) one adapter may have "
                                                              "in the engine while another adapter's requests wait")
    adapter_reserve_slots: int = Field(2, ge=0, description="LoRA engines: slots kept for an adapter with nothing "
                                                            "running, so a burst cannot take them all")
    stream: StreamPolicy = Field(default_factory=StreamPolicy, description="how streamed answers are coalesced")
    side_effect_tools: list[str] = Field(default_factory=list, description="tools (fnmatch patterns) whose calls "
                                         "act on the world: a request that may call one is not repeated after the "
                                         "upstream may have acted, unless it has an idempotency key")
    rollout_hooks: RolloutHooks = Field(default_factory=RolloutHooks, description="the verifier and reward hooks "
                                        "a rollout request may name, and their arguments' bounds")
