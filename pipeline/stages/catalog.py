"""The product stages, in pipeline order: each name's adapter class and policy model, as import
paths. A topology that names a product stage without `class:` gets its adapter from here; the
assembly (pipeline/app/assemble.py) checks every stage's policy with its model before anything
starts, importing only the config modules (a stage class may load models)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StageEntry:
    cls: str  # "package.module:Class", a pipeline.runtime.stage.Stage
    policy: str  # "package.module:Model", the stage's config.py policy model


def _entry(name: str, cls: str, policy: str) -> StageEntry:
    return StageEntry(f"pipeline.stages.{name}.stage:{cls}", f"pipeline.stages.{name}.config:{policy}")


PRODUCT_STAGES: dict[str, StageEntry] = {
    "mask": _entry("mask", "MaskStage", "MaskStagePolicy"),
    "cache": _entry("cache", "CacheStage", "CachePolicy"),
    "route": _entry("route", "RouteStage", "RoutePolicy"),
    "admit": _entry("admit", "AdmitStage", "AdmitPolicy"),
    "media": _entry("media", "MediaStage", "MediaPolicy"),
    "vision": _entry("vision", "VisionStage", "VisionPolicy"),
    "generate": _entry("generate", "GenerateStage", "GeneratePolicy"),
    "postprocess": _entry("postprocess", "PostprocessStage", "PostprocessPolicy"),
}
STAGE_CLASSES: dict[str, str] = {name: e.cls for name, e in PRODUCT_STAGES.items()}
