"""mask: the first stage. It authenticates the caller (auth.py), holds the tenant's size limit
(limits.py), and replaces PII by typed placeholders (pii.py, recognizers.py) before any other stage
sees the text; the restore mapping travels sealed (security/sealing.py, shared with postprocess) in
`masking.restore_token` for postprocess alone.

Policy: `MaskPolicy` (pipeline.stages.mask.pii), with per-tenant overrides under `tenants`.
Evidence: decision masked|clean, entity counts by type, policy version, engine revision - never
entity text.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import Field

from pipeline.contracts import RequestDoc, Response, Status
from pipeline.contracts.request import ChatMessage, MaskingSection
from pipeline.registries.tenants import TenantRegistry
from pipeline.runtime.stage import Outcome, StageContext, ThreadedStage
from pipeline.security.sealing import Keyring, keyring_for, seal
from pipeline.stages.mask.auth import authenticate
from pipeline.stages.mask.limits import size_refusal
from pipeline.stages.mask.pii import Masker, MaskFailed, MaskPolicy, MaskResult


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
        self.registry = TenantRegistry(ctx.settings.tenants, ctx.settings.tenant_defaults)

    def masker_for(self, tenant: str | None) -> Masker:
        key = tenant if tenant in self.policy.tenants else ""
        if key not in self._maskers:
            self._maskers[key] = Masker(self.policy.for_tenant(tenant))
        return self._maskers[key]

    async def start(self) -> None:
        # build the recognizers and load their models and lists before the first record
        await asyncio.to_thread(lambda: self.masker_for(None).warm())
        await self.follow_control(self.registry.apply)  # tenants and keys added while running

    def reject(self, doc: RequestDoc, error_class: str, reason: str, evidence_reason: str) -> Outcome:
        resp = Response(request_id=doc.request_id, status=Status.rejected, error_class=error_class, reason=reason,
                        answered_by=self.name)
        return Outcome.answer(doc, resp, self.evidence(doc, "rejected", f"{error_class}: {evidence_reason}"))

    def decide(self, doc: RequestDoc) -> Outcome:
        """1. authenticate (the key or the front door's assertion); 2. the tenant's size limit;
        3. mask, failing closed."""
        doc, refused, why = authenticate(doc, self.registry, self.ctx.settings.auth.required, self.keyring)
        if refused is not None:  # the caller does not learn whether a key is unknown or revoked
            told = "unknown or revoked API key" if why in ("unknown_key", "revoked_key") else why
            return self.reject(doc, refused, told, why)
        too_big = size_refusal(doc, self.registry.limits_for(doc.tenant_id))
        if too_big is not None:
            return self.reject(doc, "too_large", too_big, too_big)
        masker = self.masker_for(doc.tenant_id)
        try:
            masked, result = mask_document(doc, masker, self.keyring)
        except MaskFailed as exc:  # fail closed: answered now, never forwarded unmasked nor retried
            resp = Response(request_id=doc.request_id, status=Status.error, error_class=exc.error_class,
                            reason=f"PII masking could not complete ({exc}); the request was not processed",
                            answered_by=self.name)
            return Outcome.answer(doc, resp, self.evidence(doc, "error", exc.error_class))
        assert masked.masking is not None
        ev = self.evidence(masked, masked.masking.decision, "entities_found" if result.total else "no_entities",
                           scores={f"entities.{k}": float(v) for k, v in sorted(result.counts.items())},
                           revisions={"mask_engine": masker.revision})
        return Outcome.forward(masked, ev)
