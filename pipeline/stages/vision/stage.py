"""vision: features for every image media decoded, micro-batched across records, with a
tenant-scoped feature cache; and, for text-only models, a short description of each image (its top
labels) that generate places in the prompt by a revisioned template. Text-only requests never
reach it (`applies_to`).

Encoder in engines/mobilenet.py (MobileNetV2/ImageNet on onnxruntime); cache in
stores/feature_cache.py; pixels arrive as claim checks from media (stores/blob_store.py).
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
from pydantic import BaseModel, Field

from pipeline.contracts import RequestDoc, Response, Status
from pipeline.contracts.request import ImageFeatures, VisionSection
from pipeline.runtime.stage import Outcome, Stage, StageContext
from pipeline.stores.blob_store import BlobError, LocalBlobStore, tenant_key
from pipeline.stores.feature_cache import FeatureCache, feature_key

TEMPLATES = {"img-desc-v1": "[image {n}: {labels}]"}


class VisionPolicy(BaseModel):
    version: str = "vision-v1"
    batch_size: int = Field(16, ge=1, description="records per micro-batch")
    max_wait_ms: int = Field(5, ge=0, description="how long a micro-batch waits to fill")
    top_k: int = Field(3, ge=1, le=10)
    template_revision: str = Field("img-desc-v1", description="one of TEMPLATES")
    threads: int = Field(1, ge=1, description="onnxruntime intra-op threads")


def describe(images: list[ImageFeatures], template_revision: str) -> str:
    t = TEMPLATES[template_revision]
    return " ".join(t.format(n=f.index + 1, labels=", ".join(f"{lab} {s:.2f}" for lab, s in zip(f.labels, f.scores)))
                    for f in images)


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
        assert self.encoder is not None, "start() first"
        t0 = time.perf_counter()
        found: dict[tuple[int, int], ImageFeatures] = {}
        todo: list[tuple[int, int, str, str]] = []  # (doc, image, tenant, cache key) to encode
        failed: dict[int, BaseException] = {}
        for di, doc in enumerate(docs):
            if not (doc.media and doc.media.images):
                continue
            tenant = tenant_key(doc.tenant_id)
            for img in doc.media.images:
                key = feature_key(img.sha256, doc.media.processor_revision, self.encoder.revision)
                hit = self.cache.get(tenant, key)
                if hit is not None:
                    found[(di, img.index)] = ImageFeatures(index=img.index, cache="hit", **hit)
                else:
                    todo.append((di, img.index, tenant, key))
        encode_ms, encoded_n = 0.0, 0
        async with self._encode_lock:  # one encode at a time: it is the CPU-bound step; batches queue here
            fresh: dict[tuple[str, str], list[tuple[int, int]]] = {}  # (tenant, key) -> images needing it
            for di, ii, tenant, key in todo:
                hit = self.cache.get(tenant, key)  # a batch that held the lock before may have encoded it
                if hit is not None:
                    found[(di, ii)] = ImageFeatures(index=ii, cache="hit", **hit)
                else:
                    fresh.setdefault((tenant, key), []).append((di, ii))
            tensors, jobs = [], []
            for (tenant, key), uses in fresh.items():
                di, ii = uses[0]
                img = next(i for i in docs[di].media.images if i.index == ii)  # type: ignore[union-attr]
                try:
                    tensor = await asyncio.to_thread(self.blobs.get_array, img.tensor_ref, tenant)
                except BlobError as exc:
                    for d, _ in uses:
                        failed[d] = exc
                    continue
                tensors.append(tensor)
                jobs.append((tenant, key, uses))
            if tensors:
                t1 = time.perf_counter()
                encoded = await asyncio.to_thread(self.encoder.encode, np.stack(tensors))
                encode_ms, encoded_n = (time.perf_counter() - t1) * 1000, len(tensors)
                for (tenant, key, uses), e in zip(jobs, encoded):
                    ref = await asyncio.to_thread(self.blobs.put_array, tenant, e.embedding)
                    value = {"labels": [lab for lab, _ in e.top], "scores": [s for _, s in e.top], "embedding_ref": ref}
                    await asyncio.to_thread(self.cache.put, tenant, key, value)
                    for n, (di, ii) in enumerate(uses):  # the same image twice in one batch: encoded once
                        found[(di, ii)] = ImageFeatures(index=ii, cache="miss" if n == 0 else "hit", **value)
        service_ms = (time.perf_counter() - t0) * 1000
        out: list[Outcome | BaseException] = []
        for di, doc in enumerate(docs):
            if di in failed:
                exc = failed[di]
                resp = Response(request_id=doc.request_id, status=Status.error, error_class=exc.error_class,  # type: ignore[attr-defined]
                                reason=f"image pixels unavailable: {exc}", answered_by=self.name)
                out.append(Outcome.answer(doc, resp, self.evidence(doc, "failed", f"{exc.error_class}")))  # type: ignore[attr-defined]
                continue
            if not (doc.media and doc.media.images):
                out.append(Outcome.forward(doc))
                continue
            feats = [found[(di, i.index)] for i in doc.media.images]
            sec = VisionSection(images=feats, encoder_revision=self.encoder.revision,
                                processor_revision=doc.media.processor_revision,
                                template_revision=self.policy.template_revision,
                                description=describe(feats, self.policy.template_revision),
                                policy_version=self.policy_version)
            hits = sum(f.cache == "hit" for f in feats)
            ev = self.evidence(doc, "encoded", f"{len(feats)} image(s), {hits} feature-cache hit(s); "
                                               f"encoder {self.encoder.revision}",
                               scores={"images": float(len(feats)), "cache_hits": float(hits),
                                       "cache_misses": float(len(feats) - hits), "batch_images": float(encoded_n),
                                       "batch_records": float(len(docs)), "encode_ms": round(encode_ms, 2),
                                       "service_ms": round(service_ms, 2)})
            out.append(Outcome.forward(doc.model_copy(update={"vision": sec}), ev))
        return out
