"""feedback: check and mask `feedback/v1` records, then pass them on to `feedback.accepted` (stored
by the warehouse sink once per feedback_id). It runs in the mask worker's process, as its own
consumer group: it needs what mask has (the tenant registry, the keyring, the masker).

Per record:
1. Decode; an unreadable record goes to the DLQ with its original bytes.
2. Who gives it: an API key or the front door's assertion for exactly this feedback
   (mask's authentication); the key never goes further.
3. A declared metric, a value of its type, about the metric's kind of target (config); within the
   tenant's feedback rate (registries/metering.py), before the lookup and the masking it costs.
4. The target is the giver's tenant's (the warehouse's `requests` table, waiting out the sink's lag).
5. Comment and demonstration text is masked like a prompt (mask's masker, this tenant's policy).
6. Send the masked record, keyed by feedback_id; a refusal (2-4) goes to the DLQ with its class.
The batch returns once every send is acknowledged, so the worker commits only what went on.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiokafka import AIOKafkaProducer

from pipeline.config.settings import Settings
from pipeline.contracts.feedback import Feedback, Refusal
from pipeline.registries.metering import TenantMeter, feedback_cost, feedback_rate
from pipeline.registries.tenants import TenantRegistry
from pipeline.runtime.codec import decode, encode
from pipeline.runtime.dlq import dead_letter
from pipeline.runtime.errors import DecodeError
from pipeline.runtime.handler import Item
from pipeline.runtime.outputs import Outputs
from pipeline.runtime.serve.metrics import StageMetrics
from pipeline.runtime.topics import TopicNames
from pipeline.security.sealing import keyring_for
from pipeline.stages.mask.auth import identify
from pipeline.stages.mask.config import MaskStagePolicy
from pipeline.stages.mask.pii import Masker
from pipeline.stores.owners import Owners, owner_refusal

log = logging.getLogger(__name__)

FEEDBACK_STAGE = "feedback"


class FeedbackWorker:
    name = FEEDBACK_STAGE
    max_batch = 64
    max_wait_ms = 5
    concurrency = 1

    def __init__(self, settings: Settings, owners: Owners, worker_id: str) -> None:
        self.settings = settings
        self.names = TopicNames(settings.topic_prefix)
        self.owners = owners
        self.worker_id = worker_id
        self.metrics = StageMetrics(FEEDBACK_STAGE)
        self.registry = TenantRegistry(settings.tenants, settings.tenant_defaults)
        self.meter = TenantMeter(feedback_rate, "feedback")  # the tenant's feedback rate, in this process
        self.keyring = keyring_for(settings)
        spec = next((s for s in settings.stages if s.name == "mask"), None)
        self.mask_policy = MaskStagePolicy.model_validate(spec.policy if spec else {})
        self._maskers: dict[str, Masker] = {}
        self.producer: AIOKafkaProducer | None = None
        self.follower: Any = None

    @property
    def topics(self) -> list[str]:
        return [self.names.feedback]

    def _masker(self, tenant: str | None) -> Masker:
        key = tenant if tenant in self.mask_policy.tenants else ""
        if key not in self._maskers:
            self._maskers[key] = Masker(self.mask_policy.for_tenant(tenant))
        return self._maskers[key]

    async def start(self, producer: AIOKafkaProducer) -> None:
        from pipeline.runtime.follow.follower import ControlFollower

        self.producer = producer
        await asyncio.to_thread(lambda: self._masker(None).warm())
        s = self.settings
        if s.bootstrap:  # tenants and keys added while running
            self.follower = await ControlFollower(s.bootstrap, self.names("control"), self.registry.apply, s.kafka,
                                                  s.doorbell_dir if s.consumer.doorbell else None).start()

    async def stop(self) -> None:
        if self.follower is not None:
            await self.follower.stop()
            self.follower = None

    async def on_assigned(self, topic_partitions: list[tuple[str, int]]) -> None:
        pass  # stateless: the warehouse knows the owners

    async def on_revoked(self, topic_partitions: list[tuple[str, int]]) -> None:
        pass

    async def handle(self, items: list[Item]) -> None:
        assert self.producer is not None, "start() first"
        out = Outputs(self.producer)
        # checked together, so one target's wait for the warehouse does not hold up the batch; each
        # check meters before its first await, so tokens go in record order
        checked = await asyncio.gather(*(self._read_and_check(it) for it in items), return_exceptions=True)
        if failed := next((c for c in checked if isinstance(c, BaseException)), None):
            raise failed
        for it, accepted in zip(items, checked):
            assert not isinstance(accepted, BaseException)
            if isinstance(accepted, Refusal):
                await self._refuse(out, it, accepted)
                continue
            await out.send(self.names.feedback_accepted, encode(accepted), key=accepted.feedback_id.encode())
            self.metrics.processed("accepted")
        await out.flush()

    async def _read_and_check(self, it: Item) -> Feedback | Refusal:
        try:
            fb = decode(it.record.value, Feedback)
        except DecodeError as exc:
            return Refusal(exc.error_class, 422, str(exc))
        return await self._check(fb)

    async def _check(self, fb: Feedback) -> Feedback | Refusal:
        """Steps 2-5: the record as it goes on (giver's tenant set, proof stripped, text masked), or why not."""
        who = identify(fb, self.registry, self.settings.auth.required, self.keyring)
        if who.refused is not None or who.tenant is None:
            return Refusal(who.refused or "unauthenticated", 401, who.reason)
        refused = self.settings.feedback.refusal(fb)
        if refused is not None:
            return refused
        over = self.meter.check(who.tenant, self.registry.limits_for(who.tenant), fb.created_ms, feedback_cost(fb.value))
        if over is not None:  # before the owner lookup and the masking it would cost
            return Refusal("rate_limited", 429, over.reason)
        kind, target = fb.target
        refused = owner_refusal(await self.owners.check(who.tenant, kind, target), kind)
        if refused is not None:
            return refused
        value = fb.value
        if isinstance(value, str):
            masker = self._masker(who.tenant)
            value = (await asyncio.to_thread(masker.mask, [value])).texts[0]
        return fb.model_copy(update={"tenant_id": who.tenant, "api_key": None, "caller_assertion": None,
                                     "value": value, "masked": isinstance(value, str)})

    async def _refuse(self, out: Outputs, it: Item, why: Refusal) -> None:
        """Step 6, refused: the DLQ keeps the original bytes (an API key in them redacted) and the class."""
        self.metrics.dead_lettered(why.error_class)
        log.info("feedback refused at %s:%d@%d: %s", it.record.topic, it.record.partition, it.record.offset,
                 why.error_class)
        dl = dead_letter(it.record, stage=FEEDBACK_STAGE, worker=self.worker_id, error_class=why.error_class,
                         error=why.reason, attempts=1)
        await out.send(self.names.dlq, encode(dl), key=it.record.key, headers=list(it.record.headers or ()))
