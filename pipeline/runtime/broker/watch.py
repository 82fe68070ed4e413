"""Whether this process can reach the broker: for readiness probes, health endpoints and the front
door's fast 503 (`broker_unavailable`) while it cannot publish.

Protocol:

1. `start()` begins a probe loop on an aiokafka client this process already has (the producer's):
   every `interval_s` it asks for the metadata of the topics in `needed` only, never creating them,
   bounded by `timeout_s`. The broker is up when the answer has every one of them with partitions
   (a restarted embedded broker answers before its topics are applied again: publishing there
   would fail). Not the whole cluster's metadata: on the stack (22 topics, 121 partitions) parsing
   it cost 2.7 ms of CPU per probe in every worker and the door, once a second, in one block of
   their event loops.
2. While the broker is down the probe backs off: each failed probe doubles the wait, with jitter,
   up to `max_interval_s`; the first good answer drops it back to `interval_s`.
3. A caller that saw a publish fail or time out says so with `failed()`: the broker counts as down
   at once, without waiting for the next probe. `ok()` after a publish that was acknowledged marks
   it up just as fast.
4. Each change of state is logged once (with the reason), counted in
   `llmpipe_broker_state_changes{process, state}`, shown in `llmpipe_broker_up{process}`, and kept with
   its time in `state()` for health endpoints.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any

from aiokafka.errors import KafkaError
from aiokafka.protocol.metadata import MetadataRequest
from prometheus_client import Counter, Gauge

from pipeline.runtime.service import BackgroundTask

log = logging.getLogger(__name__)

_UP = Gauge("llmpipe_broker_up", "1 while this process reaches the broker with its topics", ("process",))
_CHANGES = Counter("llmpipe_broker_state_changes", "broker reachability changes seen by this process",
                   ("process", "state"))


class BrokerWatch:
    def __init__(self, client: Any, needed: list[str], *, process: str, interval_s: float = 1.0,
                 timeout_s: float = 1.0, max_interval_s: float = 5.0) -> None:
        self.client = client  # an aiokafka AIOKafkaClient (e.g. `producer.client`), started by its owner
        self.needed, self.process = list(needed), process
        self.interval_s, self.timeout_s, self.max_interval_s = interval_s, timeout_s, max_interval_s
        self.up = True  # the owner started against a live broker; the first probe confirms it
        self.since = time.time()
        self.reason = "started"
        self.probes = self.failures = 0
        self._task = BackgroundTask(f"broker-watch-{self.process}")
        _UP.labels(process).set(1)

    async def start(self) -> BrokerWatch:
        self._task.launch(self._loop)
        return self

    async def stop(self) -> None:
        await self._task.cancel()

    def state(self) -> dict[str, Any]:
        return {"state": "up" if self.up else "down", "since": round(self.since, 3), "reason": self.reason}

    def failed(self, reason: str) -> None:
        """Step 3: a publish failed or timed out."""
        self._set(False, reason)

    def ok(self) -> None:
        """Step 3: a publish was acknowledged."""
        self._set(True, "a publish was acknowledged")

    async def probe(self) -> tuple[bool, str]:
        """Step 1: (up, why)."""
        self.probes += 1
        try:
            async with asyncio.timeout(self.timeout_s):
                found = await self._topics_with_partitions()
        except TimeoutError:
            return False, f"no metadata answer within {self.timeout_s:g} s"
        except Exception as exc:  # noqa: BLE001 - whatever the client raises, the broker is not usable
            return False, f"metadata request failed: {type(exc).__name__}"
        missing = [t for t in self.needed if t not in found]
        if missing:
            return False, f"the broker answers but lacks topic(s) {', '.join(missing)}"
        return True, "metadata answered with every topic"

    async def _topics_with_partitions(self) -> set[str]:
        """The topics of `needed` that the broker has, with at least one partition and no error."""
        node = self.client.get_random_node()
        if node is None:
            raise KafkaError("no broker known")
        resp = await self.client.send(node, MetadataRequest(self.needed, allow_auto_topic_creation=False))
        # each topic: (error_code, name, [is_internal,] partitions)
        return {t[1] for t in resp.topics if t[0] == 0 and t[-1]}

    async def _loop(self) -> None:
        wait_s = self.interval_s
        while True:
            await asyncio.sleep(wait_s)
            up, why = await self.probe()
            self._set(up, why)
            if up:
                wait_s = self.interval_s
            else:  # step 2
                self.failures += 1
                wait_s = min(self.max_interval_s, wait_s * 2) * random.uniform(0.8, 1.2)

    def _set(self, up: bool, reason: str) -> None:
        if up == self.up:
            return
        self.up, self.since, self.reason = up, time.time(), reason
        _UP.labels(self.process).set(1 if up else 0)
        _CHANGES.labels(self.process, "up" if up else "down").inc()
        if up:
            log.info("%s: broker reachable again (%s)", self.process, reason)
        else:
            log.warning("%s: broker unreachable (%s)", self.process, reason)
