"""vision: features for every image media decoded, micro-batched across records, with a
tenant-scoped feature cache; and, for text-only models, a short description of each image (its top
labels, by a revisioned template) that vision adds to the conversation as a message (describe.py).
Text-only requests never reach it (`applies_to`).

Encoder in engines/mobilenet.py (MobileNetV2/ImageNet on onnxruntime); cache in
stores/feature_cache.py; pixels arrive as claim checks from media (stores/blob_store.py).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np

from pipeline.contracts import RequestDoc, Response, Status
from pipeline.contracts.request import ImageFeatures, VisionSection
from pipeline.runtime.stage import Outcome, Stage, StageContext
from pipeline.stages.vision.config import VisionPolicy
from pipeline.stages.vision.describe import TEMPLATES, describe, with_description
from pipeline.stores.blob_store import BlobError, LocalBlobStore, tenant_key
from pipeline.stores.feature_cache import FeatureCache, feature_key


class VisionStage(Stage):
    policy_model = VisionPolicy

    @classmethod
    def applies_to(cls, doc: RequestDoc) -> bool:
        return bool(doc.media and doc.media.images)

    def __init__(self, ctx: StageContext) -> None:
        super().__init__(ctx)
        if self.policy.template_revision not in TEMPLATES:
            raise ValueError(f"vision: unknown template_revision {self.policy.template_revision!r}")
        self.max_batch = self.policy.batch_size  # the runtime reads these per instance
        self.max_wait_ms = self.policy.max_wait_ms
        data = ctx.settings.resolved_data_dir()
        self.blobs = LocalBlobStore(data / "blobs")
        self.cache = FeatureCache(data / "features")
        self.models_dir = data / "models"
        self.encoder = None
        self._encode_lock = asyncio.Lock()

    async def start(self) -> None:
        from pipeline.engines.mobilenet import MobileNetEncoder

        self.encoder = await asyncio.to_thread(MobileNetEncoder, self.models_dir, self.policy.top_k, self.policy.threads)

    async def process_batch(self, docs: list[RequestDoc]) -> list[Outcome | BaseException]:
        """1. look every image up in the tenant's feature cache; 2. encode the misses as one batch
        (an image twice in the batch is encoded once); 3. forward each record with its features and
        description, or answer it when its pixels are gone."""
        assert self.encoder is not None, "start() first"
        t0 = time.perf_counter()
        b = _Batch(docs)
        todo = self._lookup(b)
        async with self._encode_lock:  # one encode at a time: it is the CPU-bound step; batches queue here
            await self._encode(b, todo)
        service_ms = (time.perf_counter() - t0) * 1000
        return [self._outcome(b, di, doc, service_ms) for di, doc in enumerate(docs)]

    def _lookup(self, b: _Batch) -> list[tuple[int, int, str, str]]:
        """Cache hits into `b.found`; the rest as (record, image, tenant, cache key) to encode."""
        assert self.encoder is not None
        todo = []
        for di, doc in enumerate(b.docs):
            if not (doc.media and doc.media.images):
                continue
            tenant = tenant_key(doc.tenant_id)
            for img in doc.media.images:
                key = feature_key(img.sha256, doc.media.processor_revision, self.encoder.revision)
                if not self._hit(b, di, img.index, tenant, key):
                    todo.append((di, img.index, tenant, key))
        return todo

    def _hit(self, b: _Batch, di: int, ii: int, tenant: str, key: str) -> bool:
        hit = self.cache.get(tenant, key)
        if hit is not None:
            b.found[(di, ii)] = ImageFeatures(index=ii, cache="hit", **hit)
        return hit is not None

    async def _encode(self, b: _Batch, todo: list[tuple[int, int, str, str]]) -> None:
        """Under the encode lock: the misses (less what a batch before this one encoded), encoded
        together, stored in the feature cache, and their features into `b.found`."""
        assert self.encoder is not None
        fresh: dict[tuple[str, str], list[tuple[int, int]]] = {}  # (tenant, key) -> images needing it
        for di, ii, tenant, key in todo:
            if not self._hit(b, di, ii, tenant, key):  # a batch that held the lock before may have encoded it
                fresh.setdefault((tenant, key), []).append((di, ii))
        tensors, jobs = [], []
        for (tenant, key), uses in fresh.items():
            di, ii = uses[0]
            img = next(i for i in b.docs[di].media.images if i.index == ii)  # type: ignore[union-attr]
            try:
                tensors.append(await asyncio.to_thread(self.blobs.get_array, img.tensor_ref, tenant))
            except BlobError as exc:
                b.failed.update({d: exc for d, _ in uses})
                continue
            jobs.append((tenant, key, uses))
        if not tensors:
            return
        t1 = time.perf_counter()
        encoded = await asyncio.to_thread(self.encoder.encode, np.stack(tensors))
        b.encode_ms, b.encoded_n = (time.perf_counter() - t1) * 1000, len(tensors)
        for (tenant, key, uses), e in zip(jobs, encoded):
            ref = await asyncio.to_thread(self.blobs.put_array, tenant, e.embedding)
            value = {"labels": [lab for lab, _ in e.top], "scores": [s for _, s in e.top], "embedding_ref": ref}
            await asyncio.to_thread(self.cache.put, tenant, key, value)
            for n, (di, ii) in enumerate(uses):  # the same image twice in one batch: encoded once
                b.found[(di, ii)] = ImageFeatures(index=ii, cache="miss" if n == 0 else "hit", **value)

    def _outcome(self, b: _Batch, di: int, doc: RequestDoc, service_ms: float) -> Outcome:
        assert self.encoder is not None
        if di in b.failed:
            exc = b.failed[di]
            resp = Response(request_id=doc.request_id, status=Status.error, error_class=exc.error_class,
                            reason=f"image pixels unavailable: {exc}", answered_by=self.name)
            return Outcome.answer(doc, resp, self.evidence(doc, "failed", exc.error_class))
        if not (doc.media and doc.media.images):
            return Outcome.forward(doc)
        feats = [b.found[(di, i.index)] for i in doc.media.images]
        description = describe(feats, self.policy.template_revision)
        sec = VisionSection(images=feats, encoder_revision=self.encoder.revision,
                            processor_revision=doc.media.processor_revision,
                            template_revision=self.policy.template_revision, description=description,
                            policy_version=self.policy_version)
        hits = sum(f.cache == "hit" for f in feats)
        ev = self.evidence(doc, "encoded", f"{len(feats)} image(s), {hits} feature-cache hit(s); "
                                           f"encoder {self.encoder.revision}",
                           scores={"images": float(len(feats)), "cache_hits": float(hits),
                                   "cache_misses": float(len(feats) - hits), "batch_images": float(b.encoded_n),
                                   "batch_records": float(len(b.docs)), "encode_ms": round(b.encode_ms, 2),
                                   "service_ms": round(service_ms, 2)})
        # the model reads the images as this text: a message of vision's own in the conversation
        body = doc.body.model_copy(update={"messages": with_description(doc.body.messages, description)})
        return Outcome.forward(doc.model_copy(update={"vision": sec, "body": body}), ev)


@dataclass
class _Batch:
    """One micro-batch's working state: the features found per (record, image), and failures."""

    docs: list[RequestDoc]
    found: dict[tuple[int, int], ImageFeatures] = field(default_factory=dict)
    failed: dict[int, BlobError] = field(default_factory=dict)
    encode_ms: float = 0.0
    encoded_n: int = 0
