"""Contract tests for pipeline.stores.vector_index, run against both implementations.

Every result is checked against a brute-force numpy reference: the filter predicate below is the
contract (Match = equality, or membership for a list field; Range = numeric bounds on int/float;
bool and int never cross-match in the data because they live in different fields).
"""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.stores import index_spec
from pipeline.stores import vector_index as vi
from pipeline.stores.index_spec import open_index, parse_spec
from pipeline.stores.qdrant_client_index import QdrantClientIndex
from pipeline.stores.qdrant_edge_index import EdgeIndex
from pipeline.stores.vector_index import Candidate, IndexEntry, Match, Range, VectorIndex

DIM = 16
N = 240
TENANTS = [f"t{i}" for i in range(6)]
MODELS = ["m-a", "m-b", "m-c"]
TAGS = ["x", "y", "z"]
KEYWORD_FIELDS = ("tenant", "model")
NUMERIC_FIELDS = ("expires", "n")


def unit(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    v = rng.normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def make_data(seed: int = 7, n: int = N) -> tuple[list[IndexEntry], np.ndarray]:
    rng = np.random.default_rng(seed)
    vecs = unit(rng, n)
    entries = []
    for i in range(n):
        payload = {
            "tenant": TENANTS[int(rng.integers(len(TENANTS)))],
            "model": MODELS[int(rng.integers(len(MODELS)))],
            "flag": bool(rng.integers(2)),          # unindexed bool
            "n": int(rng.integers(0, 20)),            # int, float-indexed
            "expires": float(rng.integers(0, 30)),  # float with many exact ties (boundary checks)
            "shard": int(rng.integers(0, 4)),         # unindexed int
            "tags": sorted(rng.choice(TAGS, size=int(rng.integers(0, 3)), replace=False).tolist()),
            "note": f"entry {i}",
        }
        # unusual ids on purpose: the uuid5 mapping must round-trip any string
        entries.append(IndexEntry(id=f"id-{i}/é ü {i * 7919 % 1000}", vector=vecs[i], payload=payload))
    return entries, vecs


def holds(payload: dict[str, Any], c: vi.Condition) -> bool:
    if c.field not in payload:
        return False
    v = payload[c.field]
    if isinstance(c, Match):
        values = v if isinstance(v, list) else [v]
        return any(type(x) is type(c.value) and x == c.value for x in values)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    return ((c.gt is None or v > c.gt) and (c.gte is None or v >= c.gte)
            and (c.lt is None or v < c.lt) and (c.lte is None or v <= c.lte))


def reference(entries: list[IndexEntry], vecs: np.ndarray, q: np.ndarray, conds: list[vi.Condition],
              limit: int) -> list[tuple[str, float]]:
    scores = vecs @ q
    ok = [i for i, e in enumerate(entries) if all(holds(e.payload, c) for c in conds)]
    ok.sort(key=lambda i: -scores[i])
    return [(entries[i].id, float(scores[i])) for i in ok[:limit]]


def matching_ids(entries: list[IndexEntry], conds: list[vi.Condition]) -> set[str]:
    return {e.id for e in entries if all(holds(e.payload, c) for c in conds)}


@pytest.fixture(params=["edge", "client-memory"])
def make_index(request, tmp_path: Path):
    opened: list[VectorIndex] = []

    def make(dim: int = DIM, sub: str = "shard") -> VectorIndex:
        if request.param == "edge":
            idx = EdgeIndex(tmp_path / sub, dim, keyword_fields=KEYWORD_FIELDS, numeric_fields=NUMERIC_FIELDS)
        else:
            idx = QdrantClientIndex(dim, location=":memory:", keyword_fields=KEYWORD_FIELDS,
                                    numeric_fields=NUMERIC_FIELDS)
        opened.append(idx)
        return idx

    make.kind = request.param
    yield make
    for idx in opened:
        idx.close()


@pytest.fixture
def loaded(make_index):
    entries, vecs = make_data()
    idx = make_index()
    for k in range(0, len(entries), 100):  # several batches
        idx.upsert(entries[k:k + 100])
    return idx, entries, vecs


def test_implements_protocol(make_index):
    idx = make_index()
    assert isinstance(idx, VectorIndex)
    assert idx.dim == DIM
    assert idx.name == ("qdrant-edge" if make_index.kind == "edge" else "qdrant-client")


def test_nearest_with_right_score(loaded):
    idx, entries, vecs = loaded
    assert idx.count() == N
    rng = np.random.default_rng(1)
    for q in unit(rng, 5):
        got = idx.search(q, [], limit=5)
        want = reference(entries, vecs, q, [], 5)
        assert [c.id for c in got] == [i for i, _ in want]
        assert [c.score for c in got] == pytest.approx([s for _, s in want], abs=1e-4)
    # a stored vector finds itself with cosine 1, and its payload without the internal _id
    got = idx.search(vecs[42], [], limit=1)
    assert len(got) == 1 and isinstance(got[0], Candidate)
    assert got[0].id == entries[42].id
    assert got[0].score == pytest.approx(1.0, abs=1e-4)
    assert got[0].payload == entries[42].payload
    assert "_id" not in got[0].payload


@pytest.mark.parametrize("cond", [
    Match("tenant", "t3"), Match("model", "m-b"), Match("flag", True), Match("flag", False),
    Match("n", 7), Match("shard", 2), Match("tags", "y"), Match("tenant", "nobody"),
])
def test_match_filters_exactly(loaded, cond):
    idx, entries, vecs = loaded
    want = matching_ids(entries, [cond])
    if cond.value != "nobody":
        assert 0 < len(want) < N  # a real filter
    got = idx.search(vecs[0], [cond], limit=N)
    assert {c.id for c in got} == want  # nothing that mismatches, nothing missing
    assert all(holds(c.payload, cond) for c in got)
    assert idx.count([cond]) == len(want)


@pytest.mark.parametrize("field", ["expires", "n"])
@pytest.mark.parametrize("bound", ["gt", "gte", "lt", "lte"])
def test_range_bounds(loaded, field, bound):
    idx, entries, vecs = loaded
    edge_value = entries[3].payload[field]  # an existing value: inclusive vs exclusive matters
    cond = Range(field, **{bound: edge_value})
    want = matching_ids(entries, [cond])
    assert 0 < len(want) < N
    got = idx.search(vecs[1], [cond], limit=N)
    assert {c.id for c in got} == want
    assert idx.count([cond]) == len(want)
    assert (entries[3].id in want) == (bound in ("gte", "lte"))


def test_range_two_sided_and_float_bounds(loaded):
    idx, entries, _ = loaded
    for cond in (Range("expires", gte=5, lt=12.5), Range("n", gt=2.5, lte=9), Range("tenant", gt=0)):
        assert idx.count([cond]) == len(matching_ids(entries, [cond]))
    assert idx.count([Range("tenant", gt=0)]) == 0  # a string is never in a numeric range


def random_condition(rng: random.Random) -> vi.Condition:
    kind = rng.randrange(8)
    if kind == 0:
        return Match("tenant", rng.choice(TENANTS))
    if kind == 1:
        return Match("model", rng.choice(MODELS))
    if kind == 2:
        return Match("flag", rng.random() < 0.5)
    if kind == 3:
        return Match(rng.choice(["n", "shard"]), rng.randrange(0, 20))
    if kind == 4:
        return Match("tags", rng.choice(TAGS))
    field = rng.choice(["expires", "n"])
    bounds = {}
    for b in rng.sample(["gt", "gte", "lt", "lte"], rng.randint(1, 2)):
        bounds[b] = rng.choice([rng.randrange(0, 30), rng.uniform(-1, 31)])
    return Range(field, **bounds)


def test_random_filters_match_brute_force(loaded):
    idx, entries, vecs = loaded
    rng = random.Random(11)
    qs = unit(np.random.default_rng(2), 60)
    nonempty = 0
    for k in range(60):
        conds = [random_condition(rng) for _ in range(rng.randint(1, 3))]
        limit = rng.choice([1, 3, 10])
        got = idx.search(qs[k], conds, limit=limit)
        for c in got:  # never a point that fails a condition
            assert all(holds(c.payload, cond) for cond in conds), (conds, c)
        want = reference(entries, vecs, qs[k], conds, limit)
        assert [c.id for c in got] == [i for i, _ in want], conds
        assert [c.score for c in got] == pytest.approx([s for _, s in want], abs=1e-4)
        assert idx.count(conds) == len(matching_ids(entries, conds)), conds
        nonempty += bool(want)
    assert nonempty >= 20  # the loop exercised real matches, not just empty results


def test_delete_by_conditions(loaded):
    idx, entries, vecs = loaded
    conds = [Match("tenant", "t2"), Range("expires", lt=15)]
    doomed = matching_ids(entries, conds)
    assert doomed
    assert idx.delete(conds) == len(doomed)
    assert idx.count() == N - len(doomed)
    assert idx.count(conds) == 0
    assert idx.delete(conds) == 0  # nothing left to delete
    # exactly those are gone: every other point is still found, and t2 points outside the range stay
    survivors = [e for e in entries if e.id not in doomed]
    got = idx.search(vecs[0], [], limit=N)
    assert {c.id for c in got} == {e.id for e in survivors}
    assert idx.count([Match("tenant", "t2")]) == len(matching_ids(survivors, [Match("tenant", "t2")])) > 0
    assert idx.delete([Match("flag", True)]) == len(matching_ids(survivors, [Match("flag", True)]))
    with pytest.raises(ValueError):
        idx.delete([])


def test_upsert_same_id_replaces(make_index):
    idx = make_index()
    a, b, c = unit(np.random.default_rng(3), 3)
    idx.upsert([IndexEntry("same", a, {"tenant": "t0", "n": 1}), IndexEntry("other", c, {"tenant": "t0", "n": 5})])
    idx.upsert([IndexEntry("same", b, {"tenant": "t9", "n": 2})])
    assert idx.count() == 2
    top = idx.search(b, [], limit=1)[0]
    assert (top.id, top.payload) == ("same", {"tenant": "t9", "n": 2})
    assert top.score == pytest.approx(1.0, abs=1e-4)
    assert [x.id for x in idx.search(a, [Match("tenant", "t0")], limit=5)] == ["other"]
    assert idx.count([Match("n", 1)]) == 0
    # within one batch the last entry wins
    idx.upsert([IndexEntry("dup", a, {"n": 10}), IndexEntry("dup", c, {"n": 11})])
    assert idx.count() == 3
    assert idx.search(c, [Match("n", 11)], limit=2)[0].id == "dup"
    assert idx.count([Match("n", 10)]) == 0


def test_count_with_and_without_conditions(loaded):
    idx, entries, _ = loaded
    assert idx.count() == idx.count(None) == idx.count([]) == N
    for t in TENANTS:
        assert idx.count([Match("tenant", t)]) == len(matching_ids(entries, [Match("tenant", t)]))
    assert sum(idx.count([Match("tenant", t)]) for t in TENANTS) == N


def test_rejects_bad_input(make_index):
    idx = make_index()
    v = unit(np.random.default_rng(4), 1)[0]
    with pytest.raises(ValueError):
        idx.upsert([IndexEntry("short", v[:-1], {})])
    with pytest.raises(ValueError):
        idx.upsert([IndexEntry("x", v, {"_id": "spoof"})])
    with pytest.raises(ValueError):
        idx.search(np.append(v, 0.0), [])
    with pytest.raises(TypeError):
        idx.search(v, [Match("expires", 1.5)])  # floats go through Range
    with pytest.raises(TypeError):
        idx.search(v, [("tenant", "t1")])
    with pytest.raises(ValueError):
        idx.search(v, [], limit=0)
    assert idx.count() == 0


def test_threads_share_one_index(make_index):
    idx = make_index()
    vecs = unit(np.random.default_rng(5), 200)
    errors: list[BaseException] = []

    def work(w: int) -> None:
        try:
            for k in range(25):
                i = w * 50 + k * 2
                idx.upsert([IndexEntry(f"w{w}-{k}", vecs[i], {"tenant": f"t{w}", "n": k})])
                hits = idx.search(vecs[i], [Match("tenant", f"t{w}")], limit=3)
                assert hits[0].id == f"w{w}-{k}"
                assert all(h.payload["tenant"] == f"t{w}" for h in hits)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert idx.count() == 100
    assert idx.count([Match("tenant", "t2")]) == 25


def test_closed_index_refuses_calls(make_index):
    idx = make_index()
    idx.close()
    idx.close()  # idempotent
    with pytest.raises(vi.IndexClosedError):
        idx.count()


def test_edge_persists_across_reopen(tmp_path: Path):
    entries, vecs = make_data(seed=9, n=120)
    path = tmp_path / "cache"
    idx = EdgeIndex(path, DIM, keyword_fields=KEYWORD_FIELDS, numeric_fields=NUMERIC_FIELDS)
    idx.upsert(entries)
    assert idx.delete([Match("tenant", "t1")]) == len(matching_ids(entries, [Match("tenant", "t1")]))
    q = unit(np.random.default_rng(6), 1)[0]
    conds = [Match("model", "m-a"), Range("expires", gte=10)]
    before = idx.search(q, conds, limit=5)
    count_before = idx.count()
    idx.close()

    again = EdgeIndex(path, DIM, keyword_fields=KEYWORD_FIELDS, numeric_fields=NUMERIC_FIELDS)
    try:
        assert again.count() == count_before == 120 - len(matching_ids(entries, [Match("tenant", "t1")]))
        after = again.search(q, conds, limit=5)
        assert [(c.id, c.payload) for c in after] == [(c.id, c.payload) for c in before]
        assert [c.score for c in after] == pytest.approx([c.score for c in before], abs=1e-6)
        assert set(KEYWORD_FIELDS + NUMERIC_FIELDS) <= set(again._shard.info().payload_schema)
        again.upsert([IndexEntry("new", q, {"tenant": "t1"})])  # still writable after reload
        assert again.count([Match("tenant", "t1")]) == 1
    finally:
        again.close()
    with pytest.raises(ValueError, match="dim"):
        EdgeIndex(path, DIM * 2)  # a shard keeps its dimension


@pytest.mark.parametrize("spec,kind,kwargs", [
    ("edge:/data/cache-index/edge", "edge", {"path": Path("/data/cache-index/edge")}),
    ("qdrant:http://qdrant:6333", "client", {"url": "http://qdrant:6333"}),
    ("qdrant:https://q.example.com:6334/", "client", {"url": "https://q.example.com:6334/"}),
    ("qdrant-local:/data/qlocal", "client", {"path": "/data/qlocal"}),
    ("qdrant-memory:", "client", {"location": ":memory:"}),
])
def test_open_index_dispatch(monkeypatch, spec, kind, kwargs):
    calls: list[tuple[str, tuple, dict]] = []
    monkeypatch.setattr(index_spec, "EdgeIndex", lambda *a, **k: calls.append(("edge", a, k)) or "E")
    monkeypatch.setattr(index_spec, "QdrantClientIndex", lambda *a, **k: calls.append(("client", a, k)) or "C")
    assert open_index(spec, 384, keyword_fields=("tenant",), numeric_fields=("exp",)) == ("E" if kind == "edge" else "C")
    [(got_kind, args, kw)] = calls
    assert got_kind == kind
    assert kw.pop("keyword_fields") == ("tenant",) and kw.pop("numeric_fields") == ("exp",)
    if spec.startswith("qdrant:"):
        assert kw.pop("api_key") is None  # a server's key comes from settings (qdrant_api_key), not the spec
    if kind == "edge":
        assert args == (kwargs["path"], 384) and kw == {}
    else:
        assert args == (384,) and kw == kwargs


@pytest.mark.parametrize("spec", [
    "", "edge", "edge:", "edge:   ", "qdrant:", "qdrant:localhost:6333", "qdrant:ftp://h", "qdrant:http://",
    "qdrant-local:", "qdrant-memory:/x", "redis://localhost", "Edge:/x", "/abs/dir", "memory:",
])
def test_open_index_rejects_garbage(spec):
    with pytest.raises(ValueError, match="vector index spec"):
        open_index(spec, 8)


def test_open_index_real_backends(tmp_path: Path):
    assert parse_spec("edge:rel/dir") == ("edge", str((Path.cwd() / "rel/dir").resolve()))
    v = unit(np.random.default_rng(8), 1)[0]
    for spec, cls in ((f"edge:{tmp_path / 'e'}", EdgeIndex), (f"qdrant-local:{tmp_path / 'q'}", QdrantClientIndex),
                      ("qdrant-memory:", QdrantClientIndex)):
        idx = open_index(spec, DIM, keyword_fields=("tenant",), numeric_fields=("n",))
        try:
            assert isinstance(idx, cls)
            idx.upsert([IndexEntry("a", v, {"tenant": "t", "n": 1})])
            assert [c.id for c in idx.search(v, [Match("tenant", "t"), Range("n", gte=1)])] == ["a"]
        finally:
            idx.close()
    # qdrant-local persists too (single process at a time)
    idx = open_index(f"qdrant-local:{tmp_path / 'q'}", DIM)
    try:
        assert idx.count() == 1
    finally:
        idx.close()
