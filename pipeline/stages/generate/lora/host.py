"""One generate worker's LoRA adapters in its engines: verify and load them (cold -> warm),
activate them (-> hot), follow `llmpipe adapters promote|demote`, and mark an adapter whose files
fail verification incompatible for every worker. Residency moves come back as Transitions, which
generate turns into evidence for the request that caused them, and as `weight_events` rows."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pipeline.config.lora import LoraSettings
from pipeline.config.settings import Deployment
from pipeline.contracts import WeightEvent
from pipeline.contracts.actor import ACTOR_ADAPTER
from pipeline.contracts.adapter import AdapterSpec
from pipeline.contracts.control import AdapterStateChanged
from pipeline.engines.chat_engine import EngineError, Sampling
from pipeline.registries.adapters import AdapterRegistry, verified_snapshot
from pipeline.stages.generate.lora.residency import AdapterResidency, Transition

log = logging.getLogger(__name__)

Publish = Callable[[object, bytes], Awaitable[None]]


def adapter_key(spec: AdapterSpec) -> str:
    return f"{spec.name}@{spec.revision}"


class AdapterHost:
    def __init__(self, member: str, deployments: list[Deployment], engines: dict[str, Any], lora: LoraSettings,
                 registry: AdapterRegistry, publish_control: Publish, publish_weight_event: Publish,
                 snapshots: Path) -> None:
        self.member = member
        self.snapshots = snapshots  # verified private copies the engines load (adapters.verified_snapshot)
        self.lora_deployments = [d for d in deployments if d.lora] if lora.enabled else []
        self.engines = engines  # filled by generate's start()
        self.lora = lora
        self.registry = registry
        self.publish_control = publish_control
        self.publish_weight_event = publish_weight_event
        self.residency = {d.name: AdapterResidency(lora.max_loras, lora.max_cpu_loras) for d in deployments}
        self._loading: dict[tuple[str, str], asyncio.Lock] = {}
        self._tasks: set[asyncio.Task] = set()
        self.loop: asyncio.AbstractEventLoop | None = None

    def started(self) -> None:
        """Called on the worker's loop once the engines run; promote/demote work runs there."""
        self.loop = asyncio.get_running_loop()

    async def prepare(self, d: Deployment, spec: AdapterSpec) -> tuple[str, float, list[Transition]]:
        """Make `spec` resident in `d`'s engine for a request: verify and load it when cold, activate
        it. Returns the state the request found, the load time (0 unless cold) and every move."""
        key = adapter_key(spec)
        residency = self.residency[d.name]
        async with self._loading.setdefault((d.name, key), asyncio.Lock()):
            before = residency.state(key)
            load_ms, moves = 0.0, []
            if before == "cold":
                try:
                    load_ms, moves = await self.load_verified(d, spec)
                except EngineError as exc:
                    if spec.name != ACTOR_ADAPTER:  # the actor's revisions are rejected on their own lifecycle
                        await self.mark_incompatible(spec, str(exc))
                    raise
            moves += residency.used(key)
        return before, load_ms, moves

    async def load_verified(self, d: Deployment, spec: AdapterSpec) -> tuple[float, list[Transition]]:
        """Verify `spec`'s files (allowed root, rank, checksum) and load a verified copy into `d`'s
        engine (cold -> warm): the load time and the residency moves. Raises
        EngineError(adapter_unavailable) when a check fails; nothing is loaded then."""
        engine = self.engines[d.name]
        copy, why = await asyncio.to_thread(verified_snapshot, spec, self.lora, self.snapshots, engine.revision)
        if copy is None:
            raise EngineError("adapter_unavailable", f"adapter {adapter_key(spec)} refused: {why}")
        ms = await engine.load_adapter(spec.model_copy(update={"path": copy}))
        return ms, self.residency[d.name].loaded(adapter_key(spec))

    def weight_event(self, d: Deployment, t: Transition, took: float | None, request_id: str = "",
                     detail: str = "") -> WeightEvent:
        name, _, revision = t.key.partition("@")
        return WeightEvent(replica=f"{self.member}/{d.name}", kind="adapter", name=name, revision=revision,
                           transition=t.label, duration_ms=took, request_id=request_id,
                           detail=detail or ("loaded into the CPU cache" if took is not None else ""))

    async def mark_incompatible(self, spec: AdapterSpec, why: str) -> None:
        change = AdapterStateChanged(name=spec.name, state="incompatible", reason=why)
        self.registry.apply(change)
        try:
            await self.publish_control(change, f"adapter:{spec.name}".encode())
        except Exception as exc:  # noqa: BLE001 - this worker refuses it anyway
            log.warning("generate: could not publish adapter %s as incompatible: %s", spec.name, type(exc).__name__)

    # ---- promote / demote ------------------------------------------------------------------------

    def state_changed(self, record: AdapterStateChanged) -> None:
        """Bring the engines to the registered state. Called from the control follower's thread."""
        if self.loop is not None and self.lora_deployments:
            self.loop.call_soon_threadsafe(self._start, record)

    def _start(self, record: AdapterStateChanged) -> None:
        task = asyncio.get_running_loop().create_task(self.apply_state(record))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def apply_state(self, record: AdapterStateChanged) -> None:
        spec = self.registry.specs.get(record.name)
        if spec is None:
            return
        key = adapter_key(spec)
        for d in self.lora_deployments:
            residency, engine = self.residency[d.name], self.engines[d.name]
            moves, took = [], None
            try:
                async with self._loading.setdefault((d.name, key), asyncio.Lock()):
                    if record.state in ("warm", "hot") and residency.state(key) == "cold":
                        took, moves = await self.load_verified(d, spec)
                    if record.state == "hot" and residency.state(key) != "hot":
                        # vLLM activates an adapter when a batch needs it: one token makes it resident
                        await engine.generate([{"role": "user", "content": "hi"}], Sampling(max_tokens=1),
                                              None, adapter=spec)
                        moves += residency.used(key)
                    if record.state in ("cold", "incompatible") and residency.state(key) != "cold":
                        await engine.unload_adapter(spec)
                        moves += residency.forget(key)
            except EngineError as exc:
                log.warning("generate: adapter %s could not be made %s: %s", key, record.state, exc)
                await self.mark_incompatible(spec, str(exc))
                continue
            for t in moves:
                ev = self.weight_event(d, t, took if t.label == "cold->warm" and t.key == key else None,
                                       detail=f"{record.state} by the operator")
                await self.publish_weight_event(ev, ev.name.encode())
