"""mask: the first stage. It authenticates the caller (auth.py), holds the tenant's size limit
(limits.py), and replaces PII by typed placeholders (pii.py, recognizers.py) before any other stage
sees the text; the restore mapping travels sealed (security/sealing.py, shared with postprocess) in
`masking.restore_token` for postprocess alone.

Policy: `MaskStagePolicy` (config.py), with per-tenant overrides under `tenants`.
Evidence: decision masked|clean, entity counts by type, policy version, engine revision - never
entity text.
"""

from __future__ import annotations

import asyncio

from pipeline.contracts import RequestDoc, Response, Status
from pipeline.contracts.request import ANONYMOUS_TENANT, MaskingSection
from pipeline.registries.metering import TenantMeter, request_rate
from pipeline.registries.tenants import TenantRegistry
from pipeline.runtime.stage import Outcome, StageContext, ThreadedStage
from pipeline.security.sealing import Keyring, keyring_for, seal
from pipeline.stages.mask.auth import authenticate, rollout_refusal, tool_refusal
from pipeline.stages.mask.config import MaskStagePolicy
from pipeline.stages.mask.limits import size_refusal
from pipeline.stages.mask.pii import Masker, MaskFailed, MaskResult


def mask_document(doc: RequestDoc, masker: Masker, keyring: Keyring) -> tuple[RequestDoc, MaskResult]:
    """Mask every message of the request; seal the mapping to this request_id."""
    # one text per message, then one per tool-call argument string: PII in a call's arguments (an
    # email to send to) or a tool's result is as visible to the model as in a user turn
    texts = [m.content for m in doc.body.messages]
    texts += [c.function.arguments for m in doc.body.messages for c in m.tool_calls or ()]
    result = masker.mask(texts)
    masked = iter(result.texts[len(doc.body.messages):])
    messages = [m.model_copy(update={"content": t, "tool_calls": [
        c.model_copy(update={"function": c.function.model_copy(update={"arguments": next(masked)})})
        for c in m.tool_calls] if m.tool_calls else m.tool_calls})
        for m, t in zip(doc.body.messages, result.texts)]
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
        self.meter = TenantMeter(request_rate, "requests")  # this replica's pre-check; admit is exact

    def masker_for(self, tenant: str | None) -> Masker:
        key = tenant if tenant in self.policy.tenants else ""
        if key not in self._maskers:
            self._maskers[key] = Masker(self.policy.for_tenant(tenant))
        return self._maskers[key]

    async def start(self) -> None:
        # build the recognizers and load their models and lists before the first record
        await asyncio.to_thread(lambda: self.masker_for(None).warm())
        await self.follow_control(self.registry.apply)  # tenants and keys added while running

    def reject(self, doc: RequestDoc, error_class: str, reason: str, evidence_reason: str,
               retry_after_ms: int | None = None) -> Outcome:
        resp = Response(request_id=doc.request_id, status=Status.rejected, error_class=error_class, reason=reason,
                        answered_by=self.name, retry_after_ms=retry_after_ms)
        return Outcome.answer(doc, resp, self.evidence(doc, "rejected", f"{error_class}: {evidence_reason}"))

    def decide(self, doc: RequestDoc) -> Outcome:
        """1. authenticate (the key or the front door's assertion); 2. the tenant's size limit;
        3. the tenant's rate (registries/metering.py); 4. mask, failing closed."""
        doc, refused, why = authenticate(doc, self.registry, self.ctx.settings.auth.required, self.keyring,
                                         int(self.policy.assertion_max_age_s * 1000))
        if refused is not None:  # the caller does not learn whether a key is unknown or revoked
            told = "unknown or revoked API key" if why in ("unknown_key", "revoked_key") else why
            return self.reject(doc, refused, told, why)
        no_rollouts = rollout_refusal(doc, self.policy.rollout_role)
        if no_rollouts is not None:
            return self.reject(doc, "forbidden", no_rollouts, no_rollouts)
        limits = self.registry.limits_for(doc.tenant_id)
        if (no_tools := tool_refusal(doc, limits.tools)) is not None:
            return self.reject(doc, "tool_not_allowed", no_tools, no_tools)
        too_big = size_refusal(doc, limits)
        if too_big is not None:
            return self.reject(doc, "too_large", too_big, too_big)
        over = self.meter.check(doc.tenant_id or ANONYMOUS_TENANT, limits, doc.created_ms)
        if over is not None:  # refused before the masking it would cost; admit would refuse it anyway
            return self.reject(doc, "rate_limited", over.reason, "over rate before masking", over.retry_after_ms)
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
