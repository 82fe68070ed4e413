"""The media stage's policy model (parse-only): which URLs may be fetched (`FetchRules`: schemes,
ports, each tenant's domains), how much and how long (`FetchLimits`), how pixels become the
encoder's input (`ProcessorConfig`), and how many images a request may carry."""

from __future__ import annotations

from pydantic import Field

from pipeline.config.policy import PolicyModel
from pipeline.config.settings import MAX_IMAGE_PIXELS as DEFAULT_MAX_PIXELS


class FetchRules(PolicyModel):
    """What media may fetch. Production defaults never allow a loopback or private address."""

    schemes: list[str] = Field(default_factory=lambda: ["https", "http"])
    ports: list[int] = Field(default_factory=lambda: [80, 443], description="ports allowed for any host")
    tenant_domains: dict[str, list[str]] = Field(
        default_factory=dict, description="tenant -> domains it may fetch from (a leading dot allows subdomains); "
                                          "a tenant not listed may fetch any public host")
    test_allow: list[str] = Field(default_factory=list,
                                  description="TEST ONLY: `ip:port` endpoints exempt from the address rules "
                                              "(the local test image server); empty in production")
    max_redirects: int = Field(3, ge=0)


class FetchLimits(PolicyModel):
    max_bytes: int = Field(10 << 20, ge=1)
    connect_timeout_s: float = Field(3.0, gt=0)
    read_timeout_s: float = Field(5.0, gt=0, description="between two reads")
    total_timeout_s: float = Field(10.0, gt=0, description="the whole fetch, redirects included")


class ProcessorConfig(PolicyModel):
    """How pixels become the encoder's input; its revision names the result in caches and evidence."""

    revision: str = "rgb224-imagenet-v1"
    size: int = Field(224, ge=16, description="the shorter side is resized to this, then centre-cropped square")
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    max_pixels: int = Field(DEFAULT_MAX_PIXELS, ge=1, description="width x height above this is refused unread")


class MediaPolicy(PolicyModel):
    version: str = "media-v1"
    rules: FetchRules = Field(default_factory=FetchRules)
    limits: FetchLimits = Field(default_factory=FetchLimits)
    processor: ProcessorConfig = Field(default_factory=ProcessorConfig)
    max_images: int = Field(8, ge=1)
