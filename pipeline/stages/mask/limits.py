"""The tenant's limit on what mask will read: a prompt too large is refused before any recogniser runs."""

from __future__ import annotations

from pipeline.config.tenants import TenantLimits
from pipeline.contracts import RequestDoc


def size_refusal(doc: RequestDoc, limits: TenantLimits) -> str | None:
    limit = limits.max_prompt_chars
    n = sum(len(m.content) for m in doc.body.messages)
    return f"prompt of {n} characters > {limit}" if n > limit else None
