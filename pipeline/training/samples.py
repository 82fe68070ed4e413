"""`llmpipe rollouts submit|export`: RL producers send prompts for n scored samples each, and
trainers take the samples back out of the warehouse as training-ready batches.

A prompts file is JSONL, one prompt per line: {"prompt": str} or {"messages": [...]}, optional
"id" (the group id's suffix), "expected" (exact_match) and "pattern" (regex). Every line becomes a
request of kind `rollout`; generate samples it n times and writes one `rollouts` row per sample.
Export reads the `training_samples` view (schemas/clickhouse/011, per tenant since 017_tenant_keys.sql).
Every read of samples (export, --from-feedback, RolloutStream) names its tenants, or the operator's
explicit choice of all of them (`TenantScope`): never every tenant's rows by default.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from pipeline.config.feedback import FeedbackSettings
from pipeline.contracts import RequestDoc, Response
from pipeline.contracts.request import ChatBody, ChatMessage, HookSpec, RolloutRequest
from pipeline.ingress.client import Client
from pipeline.ingress.load import TrafficLine

EXPORT_FORMATS = ("parquet", "jsonl")
VERIFIER_FIELD = {"exact_match": "expected", "regex": "pattern"}  # the prompt line's field each one reads


@dataclass(frozen=True)
class TenantScope:
    """Whose samples a trainer reads: the tenants named, or every tenant by the operator's explicit
    choice. One tenant's rollouts and feedback are training data for that tenant's model only."""

    tenants: frozenset[str] = frozenset()
    every: bool = False

    def __post_init__(self) -> None:
        if self.every == bool(self.tenants):
            raise ValueError("name the tenants whose samples to read (--tenant, repeatable) or choose --all-tenants"
                             + (", not both" if self.every else ""))

    @classmethod
    def of(cls, tenants: Iterable[str] | None, all_tenants: bool = False) -> TenantScope:
        return cls(frozenset(t for t in tenants or () if t), all_tenants)

    def admits(self, tenant: str) -> bool:
        return self.every or tenant in self.tenants

    def params(self) -> dict[str, Any]:
        """The SQL parameters of `TENANT_FILTER`."""
        return {"all_tenants": int(self.every), "tenants": sorted(self.tenants)}


ALL_TENANTS = TenantScope(every=True)
TENANT_FILTER = "({all_tenants:UInt8} = 1 OR tenant_id IN {tenants:Array(String)})"


@dataclass
class RolloutOptions:
    n: int
    actor_revision: str | None = None
    dataset_revision: str = ""
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 64
    seed: int | None = None
    verifier: str | None = None
    reward: str | None = None
    reward_args: dict[str, Any] = field(default_factory=dict)
    reference_revision: str = ""
    timeout_s: float = 300.0
    api_key: str | None = None
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])


def rollout_doc(client: Client, line: TrafficLine, o: RolloutOptions) -> RequestDoc:
    """One prompt line as a `rollout` request. Raises ValueError for a line that cannot be one."""
    b = line.body
    if "messages" in b:
        messages = [ChatMessage.model_validate(m) for m in b["messages"]]
    elif isinstance(b.get("prompt"), str) and b["prompt"].strip():
        messages = [ChatMessage(role="user", content=b["prompt"])]
    else:
        raise ValueError("a line needs a non-empty `prompt` or `messages`")
    verifier = None
    if o.verifier is not None:
        key = VERIFIER_FIELD.get(o.verifier)
        if key is not None and key not in b:
            raise ValueError(f"verifier {o.verifier} needs `{key}` on every line")
        verifier = HookSpec(name=o.verifier, args={key: b[key]} if key else dict(b.get("verifier_args", {})))
    group = f"{o.dataset_revision or 'prompts'}:{b.get('id', line.line_no)}:{o.run_id}"
    body = ChatBody(messages=messages, max_tokens=o.max_tokens, temperature=o.temperature, top_p=o.top_p, seed=o.seed,
                    logprobs=True)
    rollout = RolloutRequest(group_id=group, n=o.n, prompt_dataset_revision=o.dataset_revision,
                             actor_revision=o.actor_revision, verifier=verifier,
                             reward=HookSpec(name=o.reward, args=o.reward_args) if o.reward else None,
                             reference_revision=o.reference_revision)
    return client.build(body=body, timeout_s=o.timeout_s, api_key=line.api_key or o.api_key, rollout=rollout)


@dataclass
class SampleTally:
    """What the answers of a rollout run held: samples, their scores and the actor revisions."""

    samples: int = 0
    verified: int = 0
    scores: list[float] = field(default_factory=list)
    actor_revisions: Counter = field(default_factory=Counter)

    def add(self, resp: Response) -> None:
        self.samples += len(resp.samples)
        self.verified += sum(1 for x in resp.samples if x.verified)
        self.scores += [x.score for x in resp.samples if x.score is not None]
        if resp.actor_revision:
            self.actor_revisions[resp.actor_revision] += len(resp.samples)

    def as_json(self) -> dict[str, Any]:
        return {"samples": self.samples, "verified": self.verified,
                "mean_score": round(sum(self.scores) / len(self.scores), 4) if self.scores else None,
                "actor_revisions": dict(self.actor_revisions)}


def dataset_revision_of(path: Path, name: str | None = None) -> str:
    """A prompt file's revision: its name (or the dataset's) and a digest of its bytes, so that two
    runs on the same prompts share it and an edited file gets a new one."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return f"{name or path.stem}@sha256:{h.hexdigest()[:16]}"


EXPORT_SQL = f"""
SELECT * FROM training_samples
WHERE {TENANT_FILTER}
  AND ({{actor:String}} = '' OR actor_revision = {{actor:String}})
  AND ({{dataset:String}} = '' OR prompt_dataset_revision = {{dataset:String}})
  AND ({{include_rejected:UInt8}} = 1 OR NOT rejected)
ORDER BY tenant_id, group_id, sample_id
"""


def export_rows(query: Callable[[str, dict[str, Any]], Any], actor_revision: str | None,
                dataset_revision: str | None, include_rejected: bool = False, *,
                tenants: TenantScope) -> tuple[list[str], list[list[Any]]]:
    """Training samples of `tenants` (the view's group statistics are per tenant, so another tenant's
    group of the same id never moves these advantages)."""
    res = query(EXPORT_SQL, {"actor": actor_revision or "", "dataset": dataset_revision or "",
                             "include_rejected": int(include_rejected), **tenants.params()})
    return list(res.columns), [list(r) for r in res.rows]


FEEDBACK_EXPORT_SQL = f"""
SELECT request_id AS sample_id, if(episode_id != '', episode_id, request_id) AS group_id, request_id,
       actor_revision, concat('feedback:', metric) AS prompt_dataset_revision, tokenizer_revision,
       chat_template_revision, prompt_token_ids, generated_token_ids, logprobs, value_float AS score,
       metric, feedback_id, target, tenant_id, model, adapter, deployment, answered_at AS created_at
FROM training_candidates
WHERE {TENANT_FILTER} AND metric = {{metric:String}} AND length(generated_token_ids) > 0
  AND ({{op:String}} = '' OR ({{op:String}} = '>=' AND value_float >= {{x:Float64}})
                        OR ({{op:String}} = '<=' AND value_float <= {{x:Float64}}))
ORDER BY tenant_id, group_id, sample_id, feedback_id
"""
_SELECTOR = re.compile(r"^([a-z][a-z0-9_]{0,63})(?:(>=|<=)(-?[0-9.]+(?:e-?[0-9]+)?))?$")


def feedback_selector(text: str, settings: FeedbackSettings) -> tuple[str, str, float]:
    """`METRIC[>=X]` (or `<=X`) -> (metric, op, x). A boolean metric without a bound selects its
    good answers (1 when higher is better, else 0); a float metric without one selects all."""
    m = _SELECTOR.match(text.replace(" ", ""))
    if m is None:
        raise ValueError(f"--from-feedback: expected METRIC, METRIC>=X or METRIC<=X, got {text!r}")
    name, op, x = m.group(1), m.group(2) or "", float(m.group(3)) if m.group(3) else 0.0
    metric = settings.metric(name)
    if metric is None or metric.type not in ("boolean", "float"):
        numeric = [mm.name for mm in settings.metrics if mm.type in ("boolean", "float")]
        raise ValueError(f"--from-feedback: {name!r} is not a boolean or float metric (those: {', '.join(numeric)})")
    if metric.type == "boolean" and not op:
        op, x = (">=", 1.0) if metric.higher_is_better else ("<=", 0.0)
    return name, op, x


def feedback_export_rows(query: Callable[[str, dict[str, Any]], Any], metric: str, op: str,
                         x: float, *, tenants: TenantScope) -> tuple[list[str], list[list[Any]]]:
    """Served answers of `tenants` with this feedback, as samples: the token ids and logprobs recorded
    for them (callers that asked for logprobs), their actor and template provenance, the value as `score`."""
    res = query(FEEDBACK_EXPORT_SQL, {"metric": metric, "op": op, "x": x, **tenants.params()})
    return list(res.columns), [list(r) for r in res.rows]


def write_export(columns: list[str], rows: list[list[Any]], out: Path, fmt: str) -> None:
    """Parquet (one row group, typed columns) or JSONL (one sample per line)."""
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"format must be one of {', '.join(EXPORT_FORMATS)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        with open(out, "wb") as f:
            for r in rows:
                f.write(orjson.dumps(dict(zip(columns, r)), default=str) + b"\n")
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([dict(zip(columns, r)) for r in rows]) if rows else \
        pa.table({c: pa.array([], pa.string()) for c in columns})
    pq.write_table(table, out)


def read_export(path: Path) -> list[dict[str, Any]]:
    """An export file back as rows (the round trip the tests check)."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
