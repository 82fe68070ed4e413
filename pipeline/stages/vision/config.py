"""The vision stage's policy model (parse-only): micro-batching, how many labels describe an image,
the description template's revision and the encoder's threads."""

from __future__ import annotations

from pydantic import Field

from pipeline.config.policy import PolicyModel


class VisionPolicy(PolicyModel):
    version: str = "vision-v1"
    batch_size: int = Field(16, ge=1, description="records per micro-batch")
    max_wait_ms: int = Field(5, ge=0, description="how long a micro-batch waits to fill")
    top_k: int = Field(3, ge=1, le=10)
    template_revision: str = Field("img-desc-v1", description="one of TEMPLATES")
    threads: int = Field(1, ge=1, description="onnxruntime intra-op threads")
