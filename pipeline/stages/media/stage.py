"""media: get every image of a request (URL, data URL or blob reference), check it, decode it
within a pixel budget and store the bytes and the processor's output as claim checks. Text-only
requests never reach it (`applies_to`).

Fetch rules in guard.py (SSRF), fetching in fetch.py, decoding in decode.py,
blobs in stores/blob_store.py. A bad image answers the caller with its error class and evidence;
nothing downstream runs for it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
import re

import numpy as np

from pipeline.contracts import RequestDoc, Response, Status
from pipeline.contracts.request import ImageInfo, MediaSection
from pipeline.runtime.stage import Outcome, Stage, StageContext
from pipeline.stages.media.config import (
    MediaPolicy,
)
from pipeline.stages.media.decode import DecodeError, decode
from pipeline.stages.media.fetch import FetchError, fetch_image, sniff
from pipeline.stores.blob_store import SCHEME, BlobError, LocalBlobStore, tenant_key

log = logging.getLogger(__name__)

_DATA_URL = re.compile(r"^data:([a-z0-9.+-]+/[a-z0-9.+-]+)?(;[a-z0-9=-]+)*;base64,", re.IGNORECASE)  # the bytes decide
# the caller's input was bad (rejected) vs. the fetch failed (error: trying again may work)
REJECTED = {"fetch_refused", "too_large", "too_many_pixels", "unsupported_format", "decode_error", "blob_forbidden",
            "blob_not_found", "too_many_images"}



class MediaError(Exception):
    def __init__(self, error_class: str, reason: str, index: int) -> None:
        super().__init__(reason)
        self.error_class, self.reason, self.index = error_class, reason, index


class MediaStage(Stage):
    max_batch = 8
    max_wait_ms = 2
    policy_model = MediaPolicy
    replay_reruns = "fetches every image URL again"

    @classmethod
    def applies_to(cls, doc: RequestDoc) -> bool:
        return bool(doc.body.images)

    def __init__(self, ctx: StageContext) -> None:
        super().__init__(ctx)
        self.blobs = LocalBlobStore(ctx.settings.resolved_data_dir() / "blobs")

    async def start(self) -> None:
        if self.policy.rules.test_allow:  # an SSRF exemption must never go unnoticed
            log.warning("media: rules.test_allow exempts %d endpoint(s) from the address rules: "
                        "a test setting, never for production", len(self.policy.rules.test_allow))

    async def process_batch(self, docs: list[RequestDoc]) -> list[Outcome | BaseException]:
        # fetches wait on the network: the batch's requests run side by side
        return list(await asyncio.gather(*(self._one(d) for d in docs), return_exceptions=True))

    async def _one(self, doc: RequestDoc) -> Outcome:
        p = self.policy
        tenant = tenant_key(doc.tenant_id)
        if not doc.body.images:  # only when media is the entry stage; otherwise text-only requests skip it
            return Outcome.forward(doc)
        try:
            if len(doc.body.images) > p.max_images:
                raise MediaError("too_many_images", f"{len(doc.body.images)} images > {p.max_images}", -1)
            images = list(await asyncio.gather(*(self._image(i, src, tenant) for i, src in enumerate(doc.body.images))))
        except MediaError as exc:
            where = f"image {exc.index}: " if exc.index >= 0 else ""
            status = Status.rejected if exc.error_class in REJECTED else Status.error
            resp = Response(request_id=doc.request_id, status=status, error_class=exc.error_class,
                            reason=f"{where}{exc.reason}", answered_by=self.name)
            return Outcome.answer(doc, resp, self.evidence(doc, "refused", f"{exc.error_class}: {where}{exc.reason}",
                                                           scores={"images": float(len(doc.body.images))}))
        sec = MediaSection(images=images, processor_revision=p.processor.revision, policy_version=self.policy_version)
        doc = doc.model_copy(update={"media": sec})
        shapes = ", ".join(f"{i.kind} {i.width}x{i.height}" for i in images)
        return Outcome.forward(doc, self.evidence(doc, "decoded", f"{len(images)} image(s): {shapes}", scores={
            "images": float(len(images)), "bytes": float(sum(i.bytes for i in images)),
            "max_pixels": float(max(i.width * i.height for i in images)),
            "fetch_ms": round(sum(i.fetch_ms for i in images), 2), "decode_ms": round(sum(i.decode_ms for i in images), 2),
            "redirects": float(sum(i.redirects for i in images))}))

    async def _image(self, index: int, src: str, tenant: str) -> ImageInfo:
        p = self.policy
        fetch_ms, redirects = 0.0, 0
        try:
            if src.startswith(SCHEME):
                source = "blob"
                data = await asyncio.to_thread(self.blobs.get, src, tenant)
                kind = sniff(data)
            elif src[:5].lower() == "data:":
                source = "data"
                data, kind = self._data_url(src)
            else:
                source = "url"
                got = await fetch_image(src, p.rules, p.limits, tenant)
                data, kind, fetch_ms, redirects = got.data, got.kind, got.fetch_ms, got.redirects
            if kind is None:
                raise MediaError("unsupported_format", "not a JPEG, PNG, GIF, WebP or BMP image (by its bytes)", index)
            d = await asyncio.to_thread(decode, data, kind, p.processor)
            raw_ref, tensor_ref = await asyncio.to_thread(self._store, tenant, data, kind, d.tensor)
        except (FetchError, DecodeError, BlobError) as exc:
            raise MediaError(exc.error_class, exc.reason, index) from None
        return ImageInfo(index=index, source=source, kind=kind, sha256=hashlib.sha256(data).hexdigest(),
                         bytes=len(data), width=d.width, height=d.height, reduced=d.reduced,
                         fetch_ms=round(fetch_ms, 2), decode_ms=round(d.decode_ms, 2), redirects=redirects,
                         raw_ref=raw_ref, tensor_ref=tensor_ref)

    def _data_url(self, src: str) -> tuple[bytes, str | None]:
        m = _DATA_URL.match(src)
        if m is None:
            raise FetchError("unsupported_format", "data URLs must be base64 (data:image/...;base64,...)")
        payload = src[m.end():]
        if len(payload) * 3 // 4 > self.policy.limits.max_bytes:
            raise FetchError("too_large", f"inline image over {self.policy.limits.max_bytes} bytes")
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise FetchError("decode_error", "the data URL is not valid base64") from None
        return data, sniff(data)

    def _store(self, tenant: str, data: bytes, kind: str, tensor: np.ndarray) -> tuple[str, str]:
        return self.blobs.put(tenant, data, kind), self.blobs.put_array(tenant, tensor)
