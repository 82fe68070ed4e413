"""The cache index on a Qdrant server (or qdrant-client's local mode, for tests) through qdrant-client."""


from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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

    def delete_ids(self, ids: Sequence[str]) -> None:
        pids: list[Any] = [point_id(i) for i in ids]
        if not pids:
            return
        with self._lock:
            self._check_open()
            self._client.delete(self.collection, points_selector=self._m.PointIdsList(points=pids), wait=True)

    def payloads(self, fields: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        offset = None
        while True:  # paged, so the lock is not held for the whole scan
            with self._lock:
                self._check_open()
                records, offset = self._client.scroll(self.collection, limit=1000, offset=offset,
                                                      with_payload=[*fields, ID_FIELD], with_vectors=False)
            out.extend((c.id, c.payload) for c in (_candidate(r.id, 0.0, r.payload) for r in records))
            if offset is None:
                return out

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
