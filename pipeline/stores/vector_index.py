"""The semantic cache's vector index: one small interface, two Qdrant-backed implementations.

- `EdgeIndex` (default, embedded): qdrant-edge-py, Qdrant's own segment code in-process. Persistent
  shard directory (WAL + segments), payload indexes, filtered search in ~1 ms at 100k points.
- `QdrantClientIndex`: qdrant-client against a server (`url=`) or in local mode (`path=` or
  `location=":memory:"`). Local mode is brute force in Python (seconds per filtered search at
  100k points) and locks its directory to one process: for tests and small data only.

Pick one with `open_index(spec, dim)`:

    edge:/abs/dir               -> EdgeIndex(Path("/abs/dir"))
    qdrant:http://host:6333     -> QdrantClientIndex(url="http://host:6333")
    qdrant-local:/abs/dir       -> QdrantClientIndex(path="/abs/dir")
    qdrant-memory:              -> QdrantClientIndex(location=":memory:")

Our ids are arbitrary strings; a point's Qdrant id is uuid5(NAMESPACE, id) and the original id is
kept in payload["_id"] (stripped again from the payload of a `Candidate`). Distance is cosine;
vectors are expected L2-normalised. A filter is a list of `Match` / `Range` conditions, ANDed.
Every index guards its calls with its own lock, so worker threads may share one.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

# Fixed namespace: the same id maps to the same point id in every process and every release.
ID_NAMESPACE = uuid.UUID("5b0c3f0e-6a43-5d4e-9a51-7d1c1e0b9a11")
ID_FIELD = "_id"


@dataclass(frozen=True)
class Match:
    """Exact match on a keyword/int/bool payload field (on a list field: any element matches)."""

    field: str
    value: str | int | bool


@dataclass(frozen=True)
class Range:
    """Numeric range on an int/float payload field; any of the bounds may be None."""

    field: str
    gt: float | None = None
    gte: float | None = None
    lt: float | None = None
    lte: float | None = None


Condition = Match | Range  # a filter is a list of conditions, ANDed


@dataclass
class IndexEntry:
    id: str  # our id (any string)
    vector: Sequence[float]  # already L2-normalised, len == index.dim
    payload: dict[str, Any]  # str/int/float/bool values (and lists of str)


@dataclass
class Candidate:
    id: str
    score: float  # cosine similarity
    payload: dict[str, Any]  # without the internal "_id"


@runtime_checkable
class VectorIndex(Protocol):
    dim: int
    name: str  # "qdrant-edge" | "qdrant-client"

    def upsert(self, entries: list[IndexEntry]) -> None: ...

    def search(self, vector: Sequence[float], conditions: list[Condition], limit: int = 5) -> list[Candidate]: ...

    def delete(self, conditions: list[Condition]) -> int: ...

    def delete_ids(self, ids: Sequence[str]) -> None: ...  # ids not in the index are ignored

    def payloads(self, fields: Sequence[str]) -> list[tuple[str, dict[str, Any]]]: ...  # every entry: id, those fields

    def count(self, conditions: list[Condition] | None = None) -> int: ...

    def close(self) -> None: ...


class IndexClosedError(RuntimeError):
    pass


def point_id(entry_id: str) -> str:
    """Deterministic Qdrant point id (a UUID string) for one of our ids."""
    if not isinstance(entry_id, str):
        raise TypeError(f"an index entry id must be a str, got {type(entry_id).__name__}")
    return str(uuid.uuid5(ID_NAMESPACE, entry_id))


# ---------------------------------------------------------------------------------------------
# validation shared by both implementations
# ---------------------------------------------------------------------------------------------


def _vector(vector: Sequence[float], dim: int) -> list[float]:
    arr = np.asarray(vector, dtype=np.float32)
    if arr.shape != (dim,):
        raise ValueError(f"vector has shape {arr.shape}, the index expects ({dim},)")
    if not np.isfinite(arr).all():
        raise ValueError("vector contains NaN or inf")
    return arr.tolist()


def _scalar(value: Any, where: str) -> Any:
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"payload {where} is {value}; only finite numbers are stored")
        return value
    raise TypeError(f"payload {where} has unsupported type {type(value).__name__}")


def _payload(entry: IndexEntry) -> dict[str, Any]:
    if ID_FIELD in entry.payload:
        raise ValueError(f"payload key {ID_FIELD!r} is reserved for the entry id")
    out: dict[str, Any] = {}
    for key, value in entry.payload.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"payload keys must be non-empty str, got {key!r}")
        if isinstance(value, (list, tuple)):
            out[key] = [_scalar(v, f"{key}[]") for v in value]
        else:
            out[key] = _scalar(value, key)
    out[ID_FIELD] = entry.id
    return out


def _check_conditions(conditions: Sequence[Condition] | None) -> list[Condition]:
    if conditions is None:
        return []
    if isinstance(conditions, (Match, Range)):
        raise TypeError("conditions must be a list of Match/Range, not a single condition")
    out: list[Condition] = []
    for c in conditions:
        if isinstance(c, Match):
            if not isinstance(c.field, str) or not c.field:
                raise ValueError(f"bad field in {c!r}")
            if isinstance(c.value, np.generic):
                c = Match(c.field, c.value.item())
            if not isinstance(c.value, (str, int, bool)):
                raise TypeError(f"Match value must be str, int or bool (use Range for floats): {c!r}")
            out.append(c)
        elif isinstance(c, Range):
            if not isinstance(c.field, str) or not c.field:
                raise ValueError(f"bad field in {c!r}")
            for b in (c.gt, c.gte, c.lt, c.lte):
                if b is not None and (isinstance(b, bool) or not isinstance(b, (int, float, np.number))
                                      or not math.isfinite(float(b))):
                    raise TypeError(f"Range bounds must be finite numbers or None: {c!r}")
            out.append(c)
        else:
            raise TypeError(f"a condition must be Match or Range, got {type(c).__name__}")
    return out


def _limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a positive int, got {limit!r}")
    return limit


def _candidate(pid: Any, score: float, payload: dict[str, Any] | None) -> Candidate:
    payload = dict(payload or {})
    our_id = payload.pop(ID_FIELD, None)
    return Candidate(id=our_id if our_id is not None else str(pid), score=float(score), payload=payload)


def _f(x: float | None) -> float | None:
    return None if x is None else float(x)


# ---------------------------------------------------------------------------------------------
# qdrant-edge-py
# ---------------------------------------------------------------------------------------------


