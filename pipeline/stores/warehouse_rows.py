"""Wire models -> warehouse rows. One function per table, columns named as in the DDL."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pipeline.contracts import DlqRecord, Evidence, Feedback, Response, Rollout, RolloutConsumption, WeightEvent


def _ts(ms: int | None) -> datetime:
    return datetime.fromtimestamp((ms or 0) / 1000, tz=UTC)


DECISIONS_COLUMNS = [
    "request_id", "tenant_id", "stage", "decision", "reason", "policy_version", "revisions", "scores",
    "candidates", "labels", "attempt", "step", "worker", "partition", "offset", "enqueued", "started", "finished",
    "queue_ms", "service_ms", "replay_id", "shadow", "episode_id",
]


def decision_row(e: Evidence) -> list[Any]:
    return [
        e.request_id, e.tenant_id, e.stage, e.decision, e.reason, e.policy_version, e.revisions, e.scores,
        e.candidates, e.labels, e.attempt, e.step, e.worker, e.partition, e.offset, _ts(e.enqueued_ms), _ts(e.started_ms),
        _ts(e.finished_ms), e.queue_ms, e.service_ms, e.replay_id, int(e.shadow), e.episode_id,
    ]


REQUESTS_COLUMNS = [
    "request_id", "tenant_id", "status", "error_class", "answered_by", "route", "model", "requested_model", "adapter",
    "placement", "cache", "domain", "tokens_in", "tokens_out", "cost_usd", "ttft_ms", "tpot_ms", "e2e_ms", "stage_queue_ms",
    "stage_service_ms", "created", "finished", "replay_id", "image_count", "image_bytes", "image_max_pixels",
    "image_decode_ms", "episode_id", "experiment", "variant", "deployment", "actor_revision", "prompt_token_ids",
    "token_ids", "logprobs", "samples_requested", "tool_calls",
]


def request_row(r: Response) -> list[Any]:
    return [
        r.request_id, r.tenant_id or "", r.status.value, r.error_class or "", r.answered_by, r.route or "",
        r.model or "", r.requested_model or "", r.adapter or "", r.placement or "", r.cache or "", r.domain or "",
        r.usage.prompt_tokens,
        r.usage.completion_tokens, r.cost_usd, r.ttft_ms, r.tpot_ms, r.e2e_ms,
        {k: v.queue_ms for k, v in r.timings.items()}, {k: v.service_ms for k, v in r.timings.items()},
        _ts(r.created_ms or r.finished_ms), _ts(r.finished_ms), r.replay_id, len(r.images),
        sum(i.bytes for i in r.images), max((i.width * i.height for i in r.images), default=0),
        round(sum(i.decode_ms for i in r.images), 3), r.episode_id or "", r.experiment or "", r.variant or "",
        r.deployment or "", r.actor_revision or "", r.prompt_token_ids or [], r.token_ids or [], r.logprobs or [],
        r.samples_requested,
        [c.function.name for c in r.tool_calls or ()] + [c.function.name for x in r.choices for c in x.tool_calls or ()],
    ]


ROLLOUTS_COLUMNS = [
    "sample_id", "group_id", "request_id", "tenant_id", "prompt_dataset_revision", "actor_revision",
    "reward_revision", "verifier_revision", "reference_revision", "tokenizer_revision",
    "chat_template_revision", "temperature", "top_p", "max_tokens", "seed", "runtime", "hardware",
    "batch_context", "prompt_token_ids", "generated_token_ids", "logprobs", "finish_reason", "score",
    "created_at", "replay_id", "episode_id",
]


def rollout_row(r: Rollout) -> list[Any]:
    return [
        r.sample_id, r.group_id, r.request_id, r.tenant_id, r.prompt_dataset_revision, r.actor_revision,
        r.reward_revision, r.verifier_revision, r.reference_revision, r.tokenizer_revision,
        r.chat_template_revision, r.temperature, r.top_p, r.max_tokens, r.seed, r.runtime, r.hardware,
        r.batch_context, r.prompt_token_ids, r.generated_token_ids, r.logprobs, r.finish_reason, r.score,
        _ts(r.created_ms), r.replay_id, r.episode_id,
    ]


WEIGHT_EVENTS_COLUMNS = [
    "event_id", "replica", "kind", "name", "revision", "transition", "detail", "duration_ms", "request_id", "at",
]


def weight_event_row(w: WeightEvent) -> list[Any]:
    return [w.event_id, w.replica, w.kind, w.name, w.revision, w.transition, w.detail, w.duration_ms,
            w.request_id, _ts(w.at_ms)]


DEAD_LETTERS_COLUMNS = [
    "topic", "partition", "offset", "stage", "worker", "error_class", "attempts", "request_id", "tenant_id", "failed",
]


def dead_letter_row(d: DlqRecord) -> list[Any]:
    return [
        d.topic, d.partition, d.offset, d.stage, d.worker, d.error_class, d.attempts, d.request_id or "",
        d.tenant_id or "", _ts(d.failed_ms),
    ]


FEEDBACK_COLUMNS = [
    "feedback_id", "tenant_id", "target", "request_id", "episode_id", "metric", "metric_type", "value_float",
    "value_text", "created",
]


def feedback_row(f: Feedback) -> list[Any]:
    v = f.value
    kind = "boolean" if isinstance(v, bool) else "float" if isinstance(v, float) else "text"
    return [
        f.feedback_id, f.tenant_id or "", f.target[0], f.request_id or "", f.episode_id or "", f.metric,
        kind, float(v) if kind != "text" else None, v if isinstance(v, str) else "", _ts(f.created_ms),
    ]


CONSUMPTION_COLUMNS = [
    "batch_id", "trainer", "groups", "samples", "idle_ms", "busy_ms", "queue_age_ms", "samples_by_revision",
    "stale_by_revision", "dropped_by_revision", "flagged", "incomplete", "active_revision", "acked",
]


def consumption_row(c: RolloutConsumption) -> list[Any]:
    return [c.batch_id, c.trainer, c.groups, c.samples, c.idle_ms, c.busy_ms, c.queue_age_ms, c.samples_by_revision,
            c.stale_by_revision, c.dropped_by_revision, c.flagged, c.incomplete, c.active_revision, _ts(c.acked_ms)]
