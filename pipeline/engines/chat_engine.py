"""What every chat engine does, whichever serves it (in-process vLLM, an OpenAI-compatible server):
messages and sampling in, a Generation (text, token ids, logprobs, timings) out, or an EngineError
whose class says whether another attempt can help."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pipeline.contracts.adapter import AdapterSpec
    from pipeline.contracts.request import ChatMessage
    from pipeline.engines.tool_prompt import ToolSpec


@dataclass
class Sampling:
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0  # with logprobs: this many alternatives per position
    json_schema: dict[str, Any] | None = None  # constrain the output to this JSON Schema
    tools: ToolSpec | None = None  # the tools offered and tool_choice (engines/tool_prompt.py)
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None


@dataclass
class Generation:
    text: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str
    ttft_ms: float
    itl_ms: list[float] = field(default_factory=list)  # inter-token latencies (per streamed chunk)
    e2e_ms: float = 0.0
    model_revision: str = ""
    engine_queue_ms: float | None = None  # waiting in the engine's scheduler before the first step
    tool_calls: list[dict[str, Any]] | None = None  # OpenAI tool calls, checked against the offered tools
    adapter: str | None = None  # "name@revision" of the LoRA adapter applied (None: the base model)
    top_logprobs: list[list[tuple[str, float]]] | None = None  # per token: the likeliest (text, logprob)
    # token counts the server reported (an OpenAI-compatible server without vLLM's token ids still
    # reports usage); None: count the ids
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    @property
    def tokens_in(self) -> int:
        return len(self.prompt_token_ids) if self.prompt_tokens is None else self.prompt_tokens

    @property
    def tokens_out(self) -> int:
        return len(self.token_ids) if self.completion_tokens is None else self.completion_tokens

    @property
    def tpot_ms(self) -> float | None:
        n = self.tokens_out
        return None if n < 2 else (self.e2e_ms - self.ttft_ms) / (n - 1)


# Called with each piece of the answer as the engine makes it: its text, its token ids, their
# logprobs (when asked for). Synchronous and quick: it runs inside the engine's output loop.
OnDelta = Callable[[str, list[int], "list[float] | None"], None]


class EngineError(Exception):
    """An attempt failed. `error_class` is one word of deployments.RETRYABLE / NON_RETRYABLE."""

    def __init__(self, error_class: str, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class


class ChatEngine(Protocol):
    revision: str

    async def start(self) -> ChatEngine: ...

    async def stop(self) -> None: ...

    async def generate(self, messages: list[dict[str, str]], sampling: Sampling,
                       request_id: str | None = None, adapter: AdapterSpec | None = None,
                       on_delta: OnDelta | None = None) -> Generation:
        """The whole generation; `on_delta` sees it piece by piece meanwhile. Cancelling the call
        stops the engine's work on it (vLLM aborts the request; an HTTP stream is closed)."""
        ...


def as_chat(messages: Sequence[ChatMessage], system_prompt: str | None = None) -> list[dict[str, Any]]:
    """The conversation as a chat template reads it (vision has already added its message). A route
    variant's `system_prompt` comes first, joined with the caller's own system message when there is
    one (chat templates expect at most one, at the start)."""
    chat: list[dict[str, Any]] = [{"role": m.role, "content": m.content} for m in messages]
    for m, c in zip(messages, chat):  # a tool round trip's history (engines/tool_prompt.py renders it)
        if m.tool_calls:
            c["tool_calls"] = [t.model_dump(mode="json") for t in m.tool_calls]
        if m.tool_call_id:
            c["tool_call_id"] = m.tool_call_id
    if not system_prompt:
        return chat
    if chat and chat[0]["role"] == "system":
        return [{"role": "system", "content": f"{system_prompt}\n\n{chat[0]['content']}"}, *chat[1:]]
    return [{"role": "system", "content": system_prompt}, *chat]


def chat_prompt_ids(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """The model's chat template applied to `messages`, as token ids (a transformers tokenizer)."""
    enc = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = enc["input_ids"] if hasattr(enc, "keys") else enc
    return [int(i) for i in ids]


def chat_prompt_len(tokenizer, messages: list[dict[str, str]]) -> int:
    """len(chat_prompt_ids(...)) at a third of the cost: the template is rendered as text and counted
    by the fast tokenizer's backend, without transformers' per-call wrapping (admit counts every request)."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return len(tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids)
