"""The embedded cache index: Qdrant's own segment engine in-process (qdrant-edge-py)."""


from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.stores.vector_index import (
    ID_FIELD,
    Candidate,
    Condition,
    IndexClosedError,
    IndexEntry,
    Match,
    _candidate,
    _check_conditions,
    _f,
    _limit,
    _payload,
    _vector,
    point_id,
)


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

    def delete_ids(self, ids: Sequence[str]) -> None:
        pids = [point_id(i) for i in ids]
        if not pids:
            return
        with self._lock:
            self._check_open()
            self._shard.update(self._qe.UpdateOperation.delete_points(pids))

    def payloads(self, fields: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        offset = None
        while True:  # paged, so the lock is not held for the whole scan
            request = self._qe.ScrollRequest(offset=offset, limit=1000, with_payload=[*fields, ID_FIELD],
                                             with_vector=False)
            with self._lock:
                self._check_open()
                records, offset = self._shard.scroll(request)
            out.extend((c.id, c.payload) for c in (_candidate(r.id, 0.0, r.payload) for r in records))
            if offset is None:
                return out

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
