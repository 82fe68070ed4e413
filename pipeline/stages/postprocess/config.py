"""postprocess's policy: whether answers are un-masked (per tenant), written back to the cache, and
how a shadow hit is judged. Generate reads the same policy to un-mask what it streams."""

from __future__ import annotations

from pydantic import Field

from pipeline.config.policy import PolicyModel
from pipeline.stages.cache.config import CachePolicy


class PostprocessPolicy(PolicyModel):
    version: str = "postprocess-v1"
    unmask: bool = True
    tenant_unmask: dict[str, bool] = Field(default_factory=dict)
    cache: CachePolicy | None = Field(None, description="write-backs' boundaries and TTLs; None: the cache "
                                                        "stage's own policy from the topology (one source)")
    write_back: bool = True
    shadow_agree_min: float = Field(0.8, ge=0, le=1, description="a shadow hit whose cached answer is less "
                                                                 "similar than this to the generated one counts "
                                                                 "as a would-be false hit")

    def unmask_for(self, tenant: str | None) -> bool:
        return self.tenant_unmask.get(tenant or "", self.unmask)
