"""Feedback metrics an operator declares: what a caller may say about an answer or an episode."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from pipeline.contracts.feedback import Feedback, Refusal

MetricType = Literal["boolean", "float", "comment", "demonstration"]
MetricLevel = Literal["request", "episode"]


class FeedbackMetric(BaseModel):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")
    type: MetricType
    level: MetricLevel = Field("request", description="what the feedback is about: one answer, or a whole episode")
    higher_is_better: bool = Field(True, description="boolean and float metrics: which way is good "
                                                     "(what the report and `--from-feedback` rank by)")


    def problem(self, target: MetricLevel, value: object, max_text_chars: int) -> str | None:
        """Why `value` about a `target` is not feedback on this metric; None when it is."""
        if target != self.level:
            return f"metric {self.name} is about {'an episode' if self.level == 'episode' else 'a request'}: " \
                   f"give {self.level}_id"
        if self.type == "boolean":
            return None if isinstance(value, bool) else f"metric {self.name} takes true or false"
        if self.type == "float":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            return None if ok else f"metric {self.name} takes a finite number"
        if not isinstance(value, str) or not value.strip():
            return f"metric {self.name} takes non-empty text"
        if len(value) > max_text_chars:
            return f"metric {self.name}: text longer than {max_text_chars} characters"
        return None


def default_metrics() -> list[FeedbackMetric]:
    return [
        FeedbackMetric(name="thumbs_up", type="boolean"),
        FeedbackMetric(name="rating", type="float"),
        FeedbackMetric(name="comment", type="comment"),
        FeedbackMetric(name="demonstration", type="demonstration"),
        FeedbackMetric(name="task_success", type="boolean", level="episode"),
    ]


class FeedbackSettings(BaseModel):
    metrics: list[FeedbackMetric] = Field(default_factory=default_metrics)
    max_text_chars: int = Field(8000, ge=1, description="longest comment or demonstration accepted")
    owner_wait_s: float = Field(5.0, ge=0, description="how long a check waits for a just-answered request to "
                                                       "reach the warehouse before calling it unknown")

    @model_validator(mode="after")
    def _unique_names(self) -> FeedbackSettings:
        names = [m.name for m in self.metrics]
        if len(names) != len(set(names)):
            raise ValueError(f"feedback metric names must be unique: {names}")
        return self

    def metric(self, name: str) -> FeedbackMetric | None:
        return next((m for m in self.metrics if m.name == name), None)

    def refusal(self, fb: Feedback) -> Refusal | None:
        """Why `fb` is not feedback on a declared metric; None when it is."""
        metric = self.metric(fb.metric)
        if metric is None:
            known = ", ".join(m.name for m in self.metrics)
            return Refusal("unknown_metric", 422, f"no feedback metric {fb.metric!r} (configured: {known})")
        problem = metric.problem(fb.target[0], fb.value, self.max_text_chars)
        return None if problem is None else Refusal("invalid_feedback", 422, problem)
