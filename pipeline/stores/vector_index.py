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
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
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


class EdgeIndex:
    """Embedded Qdrant Edge shard at `path` (created if absent, loaded otherwise).

    Keyword fields get a keyword payload index, numeric fields a float payload index (it serves
    int and float values, for Match on ints as well as Range). Unindexed fields still filter
    correctly, just by reading payloads. Writes go through the shard's WAL; close() flushes.
    """

    name = "qdrant-edge"

    def __init__(self, path: Path, dim: int, keyword_fields: Sequence[str] = (),
                 numeric_fields: Sequence[str] = ()) -> None:
        import qdrant_edge as qe

        self._qe = qe
        self.dim = int(dim)
        if self.dim < 1:
            raise ValueError(f"dim must be positive, got {dim}")
        self.path = Path(path)
        self._lock = threading.RLock()
        config = qe.EdgeConfig(vectors=qe.EdgeVectorParams(size=self.dim, distance=qe.Distance.Cosine))
        existing = (self.path / "edge_config.json").exists() or (self.path / "segments").exists()
        try:
            if existing:
                self._shard = qe.EdgeShard.load(str(self.path), config)
            else:
                self.path.mkdir(parents=True, exist_ok=True)
                self._shard = qe.EdgeShard.create(str(self.path), config)
        except Exception as exc:  # the binding raises a bare Exception with Qdrant's message
            verb = "load" if existing else "create"
            raise ValueError(f"cannot {verb} the edge shard at {self.path} (dim {self.dim}): {exc}") from exc
        self._closed = False
        wanted = {f: qe.PayloadSchemaType.Keyword for f in keyword_fields}
        wanted.update({f: qe.PayloadSchemaType.Float for f in numeric_fields})
        schema = self._shard.info().payload_schema
        for field, kind in wanted.items():
            if field not in schema or schema[field].data_type != kind:
                self._shard.update(qe.UpdateOperation.create_field_index(field, kind))

    # -- helpers ----------------------------------------------------------------------------

    def _filter(self, conditions: list[Condition]):
        qe = self._qe
        if not conditions:
            return None
        must = []
        for c in conditions:
            if isinstance(c, Match):
                value = c.value
                # qdrant-edge-py 0.9.0 turns a Python bool into the integer 1/0 (bool is an int
                # subclass), which then never matches a bool payload; numpy.bool_ stays a bool.
                if isinstance(value, bool):
                    value = np.bool_(value)
                must.append(qe.FieldCondition(key=c.field, match=qe.MatchValue(value)))
            else:
                must.append(qe.FieldCondition(key=c.field, range=qe.RangeFloat(
                    gt=_f(c.gt), gte=_f(c.gte), lt=_f(c.lt), lte=_f(c.lte))))
        return qe.Filter(must=must)

    def _check_open(self) -> None:
        if self._closed:
            raise IndexClosedError(f"edge index at {self.path} is closed")

    def _count(self, flt) -> int:
        return int(self._shard.count(self._qe.CountRequest(exact=True, filter=flt)))

    # -- VectorIndex --------------------------------------------------------------------------

    def upsert(self, entries: list[IndexEntry]) -> None:
        if not entries:
            return
        qe = self._qe
        latest = {e.id: e for e in entries}  # last write wins within one batch
        points = [qe.Point(point_id(i), _vector(e.vector, self.dim), _payload(e)) for i, e in latest.items()]
        with self._lock:
            self._check_open()
            self._shard.update(qe.UpdateOperation.upsert_points(points))

    def search(self, vector: Sequence[float], conditions: list[Condition], limit: int = 5) -> list[Candidate]:
        qe = self._qe
        request = qe.QueryRequest(limit=_limit(limit), query=qe.Query.Nearest(_vector(vector, self.dim)),
                                  filter=self._filter(_check_conditions(conditions)), with_payload=True,
                                  with_vector=False)
        with self._lock:
            self._check_open()
            points = self._shard.query(request)
        return [_candidate(p.id, p.score, p.payload) for p in points]

    def delete(self, conditions: list[Condition]) -> int:
        conds = _check_conditions(conditions)
        if not conds:
            raise ValueError("delete needs at least one condition (refusing to delete everything)")
        flt = self._filter(conds)
        with self._lock:
            self._check_open()
            n = self._count(flt)
            if n:
                self._shard.update(self._qe.UpdateOperation.delete_points_by_filter(flt))
            return n

    def count(self, conditions: list[Condition] | None = None) -> int:
        flt = self._filter(_check_conditions(conditions))
        with self._lock:
            self._check_open()
            return self._count(flt)

    def flush(self) -> None:
        with self._lock:
            self._check_open()
            self._shard.flush()

    def optimize(self) -> bool:
        """Build HNSW / merge segments (blocking; ~40 s for 100k x 384 on 2 cores). Filtered
        search is already fast without it (payload index first, then exact scoring)."""
        with self._lock:
            self._check_open()
            return bool(self._shard.optimize())

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._shard.flush()
            finally:
                self._shard.close()

    def __enter__(self) -> EdgeIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------
# qdrant-client
# ---------------------------------------------------------------------------------------------


class QdrantClientIndex:
    """A collection through qdrant-client: server (`url`) or local mode (`path` / `location`).

    Payload indexes are created on a server only (local mode ignores them and warns). Local mode
    quirk (qdrant-client 1.20): payload filters cross-match bool and int (True == 1).
    """

    name = "qdrant-client"

    def __init__(self, dim: int, *, collection: str = "llmpipe_cache", url: str | None = None,
                 path: str | None = None, location: str | None = None, keyword_fields: Sequence[str] = (),
                 numeric_fields: Sequence[str] = (), api_key: str | None = None) -> None:
        from qdrant_client import QdrantClient, models

        self._m = models
        self.dim = int(dim)
        if self.dim < 1:
            raise ValueError(f"dim must be positive, got {dim}")
        if sum(x is not None for x in (url, path, location)) != 1:
            raise ValueError("QdrantClientIndex needs exactly one of url=, path= or location=")
        self.collection = collection
        self._lock = threading.RLock()
        self.local = path is not None or location == ":memory:"
        if url is not None:
            self._client = QdrantClient(url=url, api_key=api_key, check_compatibility=False)
        elif path is not None:
            Path(path).mkdir(parents=True, exist_ok=True)
            # our lock serialises calls, so sqlite may be used from the cache stage's threads
            self._client = QdrantClient(path=str(path), force_disable_check_same_thread=True)
        else:
            self._client = QdrantClient(location=location, force_disable_check_same_thread=True,
                                        **({} if self.local else {"check_compatibility": False}))
        self._closed = False
        try:
            self._ensure_collection(keyword_fields, numeric_fields)
        except BaseException:
            self._client.close()
            raise

    def _ensure_collection(self, keyword_fields: Sequence[str], numeric_fields: Sequence[str]) -> None:
        m = self._m
        if self._client.collection_exists(self.collection):
            info = self._client.get_collection(self.collection)
            params = info.config.params.vectors
            if not isinstance(params, m.VectorParams) or params.size != self.dim \
                    or params.distance != m.Distance.COSINE:
                raise ValueError(f"collection {self.collection!r} exists with vectors {params}, "
                                 f"expected a single unnamed {self.dim}-d cosine vector")
            schema = info.payload_schema or {}
        else:
            self._client.create_collection(
                self.collection, vectors_config=m.VectorParams(size=self.dim, distance=m.Distance.COSINE))
            schema = {}
        if self.local:
            return
        wanted = {f: m.PayloadSchemaType.KEYWORD for f in keyword_fields}
        wanted.update({f: m.PayloadSchemaType.FLOAT for f in numeric_fields})
        for field, kind in wanted.items():
            if field not in schema or schema[field].data_type != kind:
                self._client.create_payload_index(self.collection, field, field_schema=kind, wait=True)

    def _filter(self, conditions: list[Condition]):
        m = self._m
        if not conditions:
            return None
        must: list[Any] = []
        for c in conditions:
            if isinstance(c, Match):
                must.append(m.FieldCondition(key=c.field, match=m.MatchValue(value=c.value)))
            else:
                must.append(m.FieldCondition(key=c.field, range=m.Range(
                    gt=_f(c.gt), gte=_f(c.gte), lt=_f(c.lt), lte=_f(c.lte))))
        return m.Filter(must=must)

    def _check_open(self) -> None:
        if self._closed:
            raise IndexClosedError(f"qdrant-client index {self.collection!r} is closed")

    def _count(self, flt) -> int:
        return int(self._client.count(self.collection, count_filter=flt, exact=True).count)

    def upsert(self, entries: list[IndexEntry]) -> None:
        if not entries:
            return
        # last write wins within one batch, as it would across batches
        latest = {e.id: e for e in entries}
        ids = [point_id(i) for i in latest]
        vectors = [_vector(e.vector, self.dim) for e in latest.values()]
        payloads = [_payload(e) for e in latest.values()]
        batch = self._m.Batch(ids=ids, vectors=vectors, payloads=payloads)
        with self._lock:
            self._check_open()
            self._client.upsert(self.collection, points=batch, wait=True)

    def search(self, vector: Sequence[float], conditions: list[Condition], limit: int = 5) -> list[Candidate]:
        query = _vector(vector, self.dim)
        flt = self._filter(_check_conditions(conditions))
        limit = _limit(limit)
        with self._lock:
            self._check_open()
            res = self._client.query_points(self.collection, query=query, query_filter=flt, limit=limit,
                                            with_payload=True, with_vectors=False)
        return [_candidate(p.id, p.score, p.payload) for p in res.points]

    def delete(self, conditions: list[Condition]) -> int:
        conds = _check_conditions(conditions)
        if not conds:
            raise ValueError("delete needs at least one condition (refusing to delete everything)")
        flt = self._filter(conds)
        with self._lock:
            self._check_open()
            n = self._count(flt)  # exact within this process; a server may see concurrent writers
            if n:
                self._client.delete(self.collection, points_selector=self._m.FilterSelector(filter=flt), wait=True)
            return n

    def count(self, conditions: list[Condition] | None = None) -> int:
        flt = self._filter(_check_conditions(conditions))
        with self._lock:
            self._check_open()
            return self._count(flt)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._client.close()

    def __enter__(self) -> QdrantClientIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------
# spec parsing
# ---------------------------------------------------------------------------------------------

SPEC_HELP = ("expected edge:/dir, qdrant:http(s)://host:port, qdrant-local:/dir or qdrant-memory: "
             "(relative dirs resolve against the current directory)")


def parse_spec(spec: str) -> tuple[str, str | None]:
    """'edge:/d' -> ('edge', '/d'); 'qdrant:http://h:6333' -> ('qdrant', url);
    'qdrant-local:/d' -> ('qdrant-local', '/d'); 'qdrant-memory:' -> ('qdrant-memory', None)."""
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(f"bad vector index spec {spec!r}: {SPEC_HELP}")
    scheme, _, rest = spec.partition(":")
    rest = rest.strip()
    if scheme in ("edge", "qdrant-local"):
        if not rest:
            raise ValueError(f"bad vector index spec {spec!r}: {scheme}: needs a directory; {SPEC_HELP}")
        return scheme, str(Path(rest).expanduser().resolve())
    if scheme == "qdrant":
        if not (rest.startswith(("http://", "https://")) and len(rest.split("://", 1)[1]) > 0):
            raise ValueError(f"bad vector index spec {spec!r}: qdrant: needs an http(s):// URL; {SPEC_HELP}")
        return scheme, rest
    if scheme == "qdrant-memory":
        if rest:
            raise ValueError(f"bad vector index spec {spec!r}: qdrant-memory: takes nothing after the colon")
        return scheme, None
    raise ValueError(f"bad vector index spec {spec!r}: unknown kind {scheme!r}; {SPEC_HELP}")


def open_index(spec: str, dim: int, keyword_fields: Sequence[str] = (),
               numeric_fields: Sequence[str] = (), api_key: str | None = None) -> VectorIndex:
    """`api_key`: a Qdrant server's key (qdrant: specs only)."""
    kind, arg = parse_spec(spec)
    if kind == "edge":
        return EdgeIndex(Path(arg), dim, keyword_fields=keyword_fields, numeric_fields=numeric_fields)
    if kind == "qdrant":
        return QdrantClientIndex(dim, url=arg, keyword_fields=keyword_fields, numeric_fields=numeric_fields,
                                 api_key=api_key)
    if kind == "qdrant-local":
        return QdrantClientIndex(dim, path=arg, keyword_fields=keyword_fields, numeric_fields=numeric_fields)
    return QdrantClientIndex(dim, location=":memory:", keyword_fields=keyword_fields,
                             numeric_fields=numeric_fields)
