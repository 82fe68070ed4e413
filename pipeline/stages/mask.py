"""mask: the first stage. PII is replaced by typed placeholders before any other stage sees the
text; the restore mapping travels sealed in `masking.restore_token` for postprocess alone.

Policy: `MaskPolicy` (pipeline.stages.masker), with per-tenant overrides under `tenants`.
Evidence: decision masked|clean, entity counts by type, policy version, engine revision - never
entity text.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import Field

from pipeline.contracts import RequestDoc
from pipeline.contracts.request import ChatMessage, MaskingSection
from pipeline.runtime.stage import Outcome, StageContext, ThreadedStage
from pipeline.stages.masker import Masker, MaskPolicy, MaskResult
from pipeline.stages.restore_mapping import Keyring, keyring_for, seal


class MaskStagePolicy(MaskPolicy):
    # tenant id -> fields of MaskPolicy that differ for that tenant (e.g. extra entities)
    tenants: dict[str, dict[str, Any]] = Field(default_factory=dict)

    def for_tenant(self, tenant: str | None) -> MaskPolicy:
        base = self.model_dump(exclude={"tenants"})
        override = self.tenants.get(tenant or "", {})
        return MaskPolicy.model_validate({**base, **override}) if override else MaskPolicy.model_validate(base)


def mask_document(doc: RequestDoc, masker: Masker, keyring: Keyring) -> tuple[RequestDoc, MaskResult]:
    """Mask every message of the request; seal the mapping to this request_id."""
    result = masker.mask([m.content for m in doc.body.messages])
    messages = [ChatMessage(role=m.role, content=t) for m, t in zip(doc.body.messages, result.texts)]
    section = MaskingSection(
        decision="masked" if result.total else "clean",
        reason=f"{result.total} entities masked" if result.total else "no entities found",
        entity_counts=dict(result.counts),
        policy_version=masker.policy.version,
        engine_revision=masker.revision,
        restore_token=seal(result.mapping, doc.request_id, keyring) if result.mapping else None,
    )
    body = doc.body.model_copy(update={"messages": messages})
    return doc.model_copy(update={"body": body, "masking": section}), result


class MaskStage(ThreadedStage):
    max_batch = 16
    max_wait_ms = 2
    policy_model = MaskStagePolicy

    def __init__(self, ctx: StageContext) -> None:
        super().__init__(ctx)
        self.keyring = keyring_for(ctx.settings)
        self._maskers: dict[str, Masker] = {}

    def masker_for(self, tenant: str | None) -> Masker:
        key = tenant if tenant in self.policy.tenants else ""
        if key not in self._maskers:
            self._maskers[key] = Masker(self.policy.for_tenant(tenant))
        return self._maskers[key]

    async def start(self) -> None:
        # build and exercise the recognizers once (regexes compile lazily) before the first record
        await asyncio.to_thread(lambda: self.masker_for(None).mask(["warm-up a@b.co 010-0000-0000 김철수님"]))

    def decide(self, doc: RequestDoc) -> Outcome:
        masker = self.masker_for(doc.tenant_id)
        masked, result = mask_document(doc, masker, self.keyring)
        assert masked.masking is not None
        ev = self.evidence(masked, masked.masking.decision, "entities_found" if result.total else "no_entities",
                           scores={f"entities.{k}": float(v) for k, v in sorted(result.counts.items())},
                           revisions={"mask_engine": masker.revision})
        return Outcome.forward(masked, ev)
