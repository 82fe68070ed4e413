"""The tenant's limit on what mask will read: a prompt too large is refused before any recogniser runs."""

from __future__ import annotations

from pipeline.config.tenants import TenantLimits
from pipeline.contracts import RequestDoc
from pipeline.registries.metering import prompt_size_refusal


def size_refusal(doc: RequestDoc, limits: TenantLimits) -> str | None:
    return prompt_size_refusal(doc.body.messages, limits)  # the door checks the same, before publishing
