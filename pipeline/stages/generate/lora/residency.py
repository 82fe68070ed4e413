"""Where each LoRA adapter lives in one engine: hot (in the engine's adapter slots, ≤ max_loras),
warm (its CPU cache, ≤ max_cpu_loras) or cold (on disk only).

vLLM keeps both tiers as LRU caches and does not report moves between them, so generate keeps this
mirror: a load puts an adapter in the CPU cache (cold → warm, evicting the least recently used to
cold), a request activates it (warm → hot, demoting the least recently used hot one to warm). The
transitions become evidence and `weight_events` rows with the time a load took.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from pipeline.contracts.adapter import AdapterState


@dataclass(frozen=True)
class Transition:
    key: str  # "name@revision"
    before: AdapterState
    after: AdapterState

    @property
    def label(self) -> str:
        return f"{self.before}->{self.after}"


class AdapterResidency:
    def __init__(self, max_hot: int, max_warm: int) -> None:
        if max_warm < max_hot:
            raise ValueError("the CPU cache (max_cpu_loras) must hold at least max_loras adapters")
        self.max_hot = max_hot
        self.max_warm = max_warm
        self.warm: OrderedDict[str, None] = OrderedDict()  # every loaded adapter, least recently used first
        self.hot: OrderedDict[str, None] = OrderedDict()  # the active subset

    def state(self, key: str) -> AdapterState:
        return "hot" if key in self.hot else "warm" if key in self.warm else "cold"

    def loaded(self, key: str) -> list[Transition]:
        """`key` was loaded into the CPU cache."""
        if key in self.warm:
            return []
        out = [Transition(key, "cold", "warm")]
        self.warm[key] = None
        while len(self.warm) > self.max_warm:
            old, _ = self.warm.popitem(last=False)
            out.append(Transition(old, self.state_if_evicted(old), "cold"))
            self.hot.pop(old, None)
        return out

    def state_if_evicted(self, key: str) -> AdapterState:
        return "hot" if key in self.hot else "warm"

    def forget(self, key: str) -> list[Transition]:
        """`key` was removed from the engine."""
        if key not in self.warm:
            return []
        before = self.state(key)
        self.warm.pop(key, None)
        self.hot.pop(key, None)
        return [Transition(key, before, "cold")]

    def used(self, key: str) -> list[Transition]:
        """A request runs with `key` (loaded before)."""
        out: list[Transition] = []
        if key not in self.warm:
            out += self.loaded(key)
        self.warm.move_to_end(key)
        if key in self.hot:
            self.hot.move_to_end(key)
            return out
        self.hot[key] = None
        out.append(Transition(key, "warm", "hot"))
        while len(self.hot) > self.max_hot:
            old, _ = self.hot.popitem(last=False)
            out.append(Transition(old, "hot", "warm"))
        return out
