"""The answer when a request's adapter may not run: admit's and generate's refusal (the check is
the registry's: pipeline.registries.adapters.refuse_adapter)."""

from __future__ import annotations

from pipeline.contracts import Response, Status
from pipeline.runtime.stage import Outcome


def adapter_refusal(stage, doc, error_class: str, reason: str):
    """The answer and evidence when a request's adapter may not run (the request never runs)."""
    resp = Response(request_id=doc.request_id, status=Status.rejected, error_class=error_class, reason=reason,
                    answered_by=stage.name)
    ev = stage.evidence(doc, "refused", f"{error_class}: {reason}", labels={"adapter": doc.route.adapter or ""})
    return Outcome.answer(doc, resp, ev)
