"""An OpenAI-compatible chat deployment over HTTP (e.g. a vLLM server), streamed, so TTFT and
inter-token latencies are measured here exactly as for the in-process engine.

vLLM's server extensions give token ids (`return_token_ids`) and per-token logprobs; a server that
lacks them still answers, with empty token ids. Transport and status failures become EngineErrors
whose class tells generate whether a retry or a fallback can help.
"""

from __future__ import annotations

import os
import time
from typing import Any

import httpx
import orjson

from pipeline.contracts.adapter import AdapterSpec
from pipeline.engines.chat_engine import EngineError, Generation, OnDelta, Sampling
from pipeline.engines.tool_prompt import ToolCallInvalid, check_calls


def _status_class(status: int, message: str) -> str:
    if status in (400, 422):
        low = message.lower()
        return "context_too_long" if ("max_model_len" in low or "context length" in low) else "invalid_request"
    if status in (401, 403):
        return "unauthorized"
    if status in (429, 503):
        return "overloaded"
    if status >= 500:
        return "server_error"
    return "invalid_request"


class OpenAIEngine:
    def __init__(self, base_url: str, model: str, *, revision: str = "", api_key_env: str | None = None,
                 connect_timeout_s: float = 2.0, read_timeout_s: float = 60.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.revision = revision
        self.api_key_env = api_key_env
        self.timeout = httpx.Timeout(read_timeout_s, connect=connect_timeout_s)
        self.client: httpx.AsyncClient | None = None

    async def start(self) -> OpenAIEngine:
        headers = {}
        if self.api_key_env and os.environ.get(self.api_key_env):
            headers["Authorization"] = f"Bearer {os.environ[self.api_key_env]}"
        # no proxies from the environment, no cookies kept: this talks to a configured deployment only
        self.client = httpx.AsyncClient(timeout=self.timeout, headers=headers, trust_env=False)
        return self

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.aclose()
            self.client = None

    def body(self, messages: list[dict[str, str]], s: Sampling) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": s.max_tokens,
                                "temperature": s.temperature, "top_p": s.top_p, "stream": True,
                                "stream_options": {"include_usage": True}, "return_token_ids": True}
        if s.seed is not None:
            body["seed"] = s.seed
        if s.logprobs:
            body["logprobs"] = True
            if s.top_logprobs:
                body["top_logprobs"] = s.top_logprobs
        if s.stop:
            body["stop"] = list(s.stop)
        if s.presence_penalty:
            body["presence_penalty"] = s.presence_penalty
        if s.frequency_penalty:
            body["frequency_penalty"] = s.frequency_penalty
        if s.logit_bias:
            body["logit_bias"] = {str(k): v for k, v in s.logit_bias.items()}
        if s.json_schema is not None:
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "output", "schema": s.json_schema, "strict": True}}
        if s.tools is not None and s.tools.tools:  # passed through: the server's model calls them natively
            body["tools"] = list(s.tools.tools)
            body["tool_choice"] = s.tools.choice if s.tools.choice in ("auto", "none", "required") else \
                {"type": "function", "function": {"name": s.tools.choice}}
            body["parallel_tool_calls"] = s.tools.parallel
        return body

    async def generate(self, messages: list[dict[str, str]], sampling: Sampling,
                       request_id: str | None = None, adapter: AdapterSpec | None = None,
                       on_delta: OnDelta | None = None) -> Generation:
        if self.client is None:
            raise EngineError("engine_dead", "the engine is not started")
        if adapter is not None:  # candidates() never sends one here (Deployment.lora is vllm-only)
            raise EngineError("adapter_unavailable", "this engine does not serve LoRA adapters")
        headers = {"X-Request-Id": request_id} if request_id else {}
        t0 = time.perf_counter()
        try:
            async with self.client.stream("POST", f"{self.base_url}/chat/completions",
                                          content=orjson.dumps(self.body(messages, sampling)),
                                          headers={"Content-Type": "application/json", **headers}) as resp:
                if resp.status_code != 200:
                    raw = (await resp.aread())[:2000]
                    try:
                        message = str(orjson.loads(raw).get("error", {}).get("message", ""))
                    except (orjson.JSONDecodeError, AttributeError):
                        message = raw.decode(errors="replace")
                    raise EngineError(_status_class(resp.status_code, message), f"HTTP {resp.status_code}: {message}")
                return await self._read_stream(resp, sampling, t0, on_delta)
        except httpx.ConnectTimeout as exc:
            raise EngineError("timeout", f"connect timeout to {self.base_url}") from exc
        except httpx.ConnectError as exc:
            raise EngineError("connection_refused", f"cannot connect to {self.base_url}: {exc}") from exc
        except httpx.TimeoutException as exc:
            raise EngineError("timeout", f"{type(exc).__name__} from {self.base_url}") from exc
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            raise EngineError("connection_reset", f"connection to {self.base_url} broke: {exc}") from exc

    async def _read_stream(self, resp: httpx.Response, sampling: Sampling, t0: float,
                           on_delta: OnDelta | None) -> Generation:
        text: list[str] = []
        prompt_ids: list[int] = []
        token_ids: list[int] = []
        logprobs: list[float] = []
        top: list[list[tuple[str, float]]] = []
        finish = None
        fingerprint = ""
        usage: dict = {}
        first: float | None = None
        last = t0
        itl: list[float] = []
        done = False
        calls: dict[int, dict[str, Any]] = {}  # streamed tool calls by index: the arguments come in pieces
        async for line in resp.aiter_lines():
            # read to the end of the body even after [DONE]: httpx closes a connection whose
            # response was left unread, and the next request would pay a new TCP connect
            if done or not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                continue
            chunk = orjson.loads(data)
            if "error" in chunk:
                err = chunk["error"]
                raise EngineError("server_error", str(err.get("message", err) if isinstance(err, dict) else err))
            prompt_ids = chunk.get("prompt_token_ids") or prompt_ids
            fingerprint = chunk.get("system_fingerprint") or fingerprint
            usage = chunk.get("usage") or usage  # the last chunk, with stream_options.include_usage
            for choice in chunk.get("choices") or []:
                delta = (choice.get("delta") or {}).get("content") or ""
                ids = choice.get("token_ids") or []
                if delta or ids:
                    now = time.perf_counter()
                    if first is None:
                        first = now
                    else:
                        itl.append((now - last) * 1000)
                    last = now
                text.append(delta)
                token_ids.extend(int(i) for i in ids)
                content = (choice.get("logprobs") or {}).get("content") or []
                lps = [float(lp["logprob"]) for lp in content]
                logprobs.extend(lps)
                if sampling.top_logprobs:
                    top.extend([(str(t.get("token", "")), float(t["logprob"])) for t in lp.get("top_logprobs") or []]
                               for lp in content)
                if on_delta is not None and (delta or ids):
                    on_delta(delta, [int(i) for i in ids], lps if sampling.logprobs else None)
                finish = choice.get("finish_reason") or finish
                for piece in (choice.get("delta") or {}).get("tool_calls") or []:
                    call = calls.setdefault(int(piece.get("index", 0)), {"id": "", "type": "function",
                                                                       "function": {"name": "", "arguments": ""}})
                    call["id"] = piece.get("id") or call["id"]
                    fn = piece.get("function") or {}
                    call["function"]["name"] += fn.get("name") or ""
                    call["function"]["arguments"] += fn.get("arguments") or ""
        if not done:
            raise EngineError("connection_reset", "the stream ended before [DONE]")
        end = time.perf_counter()
        tool_calls = [calls[i] for i in sorted(calls)] or None
        if tool_calls is not None:
            if sampling.tools is None:
                raise EngineError("tool_call_invalid", "the server answered with tool calls to a request without tools")
            try:
                check_calls(tool_calls, sampling.tools)
            except ToolCallInvalid as exc:
                raise EngineError("tool_call_invalid", str(exc)) from None
        return Generation(text="".join(text), tool_calls=tool_calls, prompt_token_ids=prompt_ids, token_ids=token_ids,
                          logprobs=logprobs if sampling.logprobs else None,
                          top_logprobs=top if sampling.logprobs and sampling.top_logprobs else None,
                          finish_reason=str(finish or "unknown"),
                          ttft_ms=((first or end) - t0) * 1000, itl_ms=itl, e2e_ms=(end - t0) * 1000,
                          model_revision=self.revision or f"{self.model}@{fingerprint or 'unknown'}",
                          prompt_tokens=_count(usage, "prompt_tokens"), completion_tokens=_count(usage, "completion_tokens"))


def _count(usage: dict, key: str) -> int | None:
    """A usage count the server reported, or None (then the token ids are counted)."""
    v = usage.get(key) if isinstance(usage, dict) else None
    return int(v) if isinstance(v, int) and v >= 0 else None
