"""Hostile input, generated: HTTP bodies at the front door and raw records on `requests` and
`stage.*`. Every case gets a 4xx, an answer, or a DLQ record; nothing crashes, hangs or grows
without bound. `make test` runs LLMPIPE_FUZZ_EXAMPLES (default 500) of each; bench/fuzz_bench.py
runs more.

The stack under test is real: the embedded broker, the door (ASGI, in-process), mask (the
product's authentication, size limits and PII masking) and the runtime's test answerer, on a
loop of their own so hypothesis can drive it from synchronous tests.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import threading
import time
import uuid
from collections.abc import Coroutine
from typing import Any

import httpx
import orjson
import pytest
from aiokafka import AIOKafkaProducer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.app.assemble import topology_for
from pipeline.app.launch import stage_worker
from pipeline.contracts import DlqRecord, Response
from pipeline.ingress.http import FrontDoor
from pipeline.registries.tenants import key_hash, new_api_key
from pipeline.runtime.codec import decode
from pipeline.runtime.topics import TopicNames
from tests.support.kafka import create_topics, read_topic, settings_for

pytestmark = pytest.mark.integration

EXAMPLES = int(os.environ.get("LLMPIPE_FUZZ_EXAMPLES", "500"))
BATCH = 50  # Kafka records per hypothesis example
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                suppress_health_check=list(HealthCheck))


class FuzzStack:
    """Door + mask + answer on a private event loop in a thread."""

    def __init__(self, bootstrap: str, prefix: str, data_dir) -> None:
        self.key = new_api_key()
        self.s = settings_for(data_dir, prefix, bootstrap,
                              [{"name": "mask"}, {"name": "answer", "class": "tests.stages:Answer"}],
                              tenants=[{"name": "fuzz", "api_keys": [{"key_sha256": key_hash(self.key)}]}],
                              http={"max_body_bytes": 256 << 10, "request_timeout_s": 30})
        self.names = TopicNames(prefix)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def call(self, coro: Coroutine, timeout: float = 120) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self) -> None:
        await create_topics(self.s)
        topo = topology_for(self.s)
        self.workers = [await stage_worker(self.s, topo, n, self.s.bootstrap).start() for n in ("mask", "answer")]
        self.door = await FrontDoor(self.s, self.s.bootstrap).start()
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.door.app), base_url="http://door")
        self.producer = AIOKafkaProducer(bootstrap_servers=self.s.bootstrap, acks="all", max_request_size=8 << 20)
        await self.producer.start()

    async def _stop(self) -> None:
        await self.producer.stop()
        await self.http.aclose()
        await self.door.stop()
        for w in reversed(self.workers):
            await w.stop()

    def __enter__(self) -> FuzzStack:
        self.thread.start()
        self.call(self._start(), 180)
        return self

    def __exit__(self, *exc: object) -> None:
        self.call(self._stop(), 120)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def fuzz(broker, tmp_path_factory):
    with FuzzStack(broker.bootstrap, f"f{uuid.uuid4().hex[:8]}.", tmp_path_factory.mktemp("fuzz")) as stack:
        yield stack


# ---- strategies -------------------------------------------------------------------------------

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=12), inner, max_size=5)), max_leaves=30)
roles = st.sampled_from(["user", "system", "assistant", "developer", "tool", "admin", "", "USER"])
contents = st.one_of(st.text(max_size=300), json_values,
                     st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "audio"]),
                                                     "text": st.text(max_size=50)}), max_size=3))
messages = st.lists(st.fixed_dictionaries({"role": roles, "content": contents}), max_size=6)
schemas = st.one_of(json_values, st.fixed_dictionaries({
    "type": st.sampled_from(["object", "string", "array"]),
    "pattern": st.sampled_from(["^(a|aa)+$", "(", "[a-z]+", "^(\\w+\\s?)*$"]),
    "$ref": st.sampled_from(["#", "#/x", "http://169.254.169.254/", "file:///etc/passwd"])}))


def dumps(value: Any) -> bytes:
    """Any JSON value, with what orjson cannot write: integers past 64 bits, lone surrogates."""
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


def deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


chat_bodies = st.fixed_dictionaries(
    {"messages": st.one_of(messages, json_values)},
    optional={"model": json_values, "max_tokens": st.one_of(st.integers(-5, 10**9), json_values),
              "temperature": json_values, "stream": json_values, "n": st.integers(-1, 3),
              "logprobs": json_values, "tools": json_values, "seed": json_values,
              "response_format": st.one_of(json_values, st.fixed_dictionaries(
                  {"type": st.just("json_schema"), "json_schema": st.fixed_dictionaries(
                      {"name": st.text(max_size=80), "schema": schemas})})),
              "llmpipe": st.one_of(json_values, st.fixed_dictionaries(
                  {"timeout_s": json_values, "context": json_values, "device": json_values}))})

raw_bodies = st.one_of(
    chat_bodies.map(dumps),
    json_values.map(dumps),
    st.binary(max_size=300),  # invalid JSON, invalid UTF-8
    st.integers(1000, 5000).map(deep),  # nesting far past any parser's limit
    st.integers(1, 4000).map(lambda n: orjson.dumps({"messages": [{"role": "user", "content": "x"}] * n})),
    st.integers(0, 3).map(lambda i: orjson.dumps({"messages": [{"role": "user", "content": "y" * (70_000 << i)}]})),
)
headers = st.fixed_dictionaries({}, optional={
    "authorization": st.one_of(st.just("VALID"), st.text(max_size=60).map(lambda t: "Bearer " + t),
                               st.integers(0, 70_000).map(lambda n: "Bearer " + "k" * n)),
    "idempotency-key": st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=300),
    "content-type": st.sampled_from(["application/json", "text/plain", "multipart/form-data"]),
})


# ---- the front door ---------------------------------------------------------------------------

def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_hostile_http_bodies_get_a_4xx_or_an_answer_never_a_crash(fuzz):
    seen: dict[int, int] = {}
    rss0 = _rss_mb()

    @FUZZ
    @given(body=raw_bodies, hdrs=headers)
    def one(body: bytes, hdrs: dict[str, str]) -> None:
        hdrs = dict(hdrs)
        if hdrs.get("authorization") == "VALID":
            hdrs["authorization"] = f"Bearer {fuzz.key}"
        t0 = time.monotonic()
        raw = {k: v.encode() for k, v in hdrs.items()}  # bytes: non-ASCII reaches the server as it would
        r = fuzz.call(fuzz.http.post("/v1/chat/completions", content=body, headers=raw, timeout=60), 90)
        took = time.monotonic() - t0
        seen[r.status_code] = seen.get(r.status_code, 0) + 1
        assert r.status_code == 200 or 400 <= r.status_code < 500, (r.status_code, r.text[:300])
        assert took < 30, f"{took:.1f}s for one request"
        if r.status_code != 200:  # an OpenAI-shaped error that says what is wrong, never a traceback
            err = r.json()["error"]
            assert err["message"] and err["code"] and "Traceback" not in r.text
        else:
            assert r.json()["choices"][0]["message"]["content"] is not None

    one()
    assert sum(seen.values()) >= EXAMPLES
    assert seen.get(200, 0) > 0 and sum(n for s, n in seen.items() if 400 <= s < 500) > EXAMPLES // 2, seen
    assert _rss_mb() - rss0 < 300, f"memory grew by {_rss_mb() - rss0:.0f} MB"
    health = fuzz.call(fuzz.http.get("/healthz"))
    assert health.status_code == 200


# ---- raw records on the topics ----------------------------------------------------------------

def _valid_doc(fuzz: FuzzStack) -> dict:
    return {"schema": "request/v1", "request_id": uuid.uuid4().hex, "api_key": fuzz.key,
            "reply_to": {"topic": fuzz.names.responses, "partition": 0},
            "body": {"messages": [{"role": "user", "content": "hello"}]}}


def _mutations(fuzz: FuzzStack):
    """A valid request with one field replaced by arbitrary JSON (often schema-invalid)."""
    fields = st.sampled_from(["schema", "request_id", "body", "tenant_id", "deadline_ms", "reply_to", "context",
                              "attempt", "caller_assertion", "api_key", "masking", "rollout", "extra"])
    return st.tuples(fields, json_values).map(lambda fv: dumps({**_valid_doc(fuzz), fv[0]: fv[1]}))


def test_hostile_kafka_records_are_answered_or_dead_lettered(fuzz):
    records = st.one_of(st.binary(max_size=400), json_values.map(dumps), _mutations(fuzz),
                        st.integers(1000, 3000).map(deep), st.just(b""))
    sent: list[tuple[str, int, int, set[str]]] = []  # topic, partition, offset, request ids it may be answered by

    async def produce(batch: list[tuple[str, bytes, bool]]) -> None:
        futs = []
        for topic, value, with_header in batch:
            rid = uuid.uuid4().hex if with_header else None
            hdrs = [("request_id", rid.encode())] if rid else []
            futs.append((rid, await fuzz.producer.send(topic, value, headers=hdrs)))
        for (rid, fut), (_, value, _) in zip(futs, batch):
            md = await fut
            sent.append((md.topic, md.partition, md.offset, {rid, _body_request_id(value)} - {None}))

    @settings(FUZZ, max_examples=max(1, EXAMPLES // BATCH))
    @given(batch=st.lists(st.tuples(st.sampled_from([fuzz.names.requests, fuzz.names.stage_input("mask"),
                                                     fuzz.names.stage_input("answer")]),
                                    records, st.booleans()), min_size=BATCH, max_size=BATCH))
    def one(batch):
        fuzz.call(produce(batch))

    one()
    assert len(sent) >= EXAMPLES

    # every record is accounted for: a DLQ record naming it, or an answer to the request it carries
    def accounted() -> tuple[int, list]:
        dlq = {(d.topic, d.partition, d.offset) for d in (decode(r.value, DlqRecord) for r in
               fuzz.call(read_topic(fuzz.s.bootstrap, fuzz.names.dlq, 10**6, timeout=3)))}
        answered = {decode(r.value, Response).request_id for r in
                    fuzz.call(read_topic(fuzz.s.bootstrap, fuzz.names.responses, 10**6, timeout=3))}
        missing = [s for s in sent if s[:3] not in dlq and not _answered(s, answered)]
        return len(sent) - len(missing), missing

    deadline = time.monotonic() + 180
    while True:
        done, missing = accounted()
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert not missing, f"{len(missing)} of {len(sent)} records neither answered nor dead-lettered: {missing[:5]}"
    # the stack still answers ordinary traffic
    ok = fuzz.call(fuzz.http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "still up"}]},
                                  headers={"authorization": f"Bearer {fuzz.key}"}))
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "STILL UP"


def _body_request_id(value: bytes) -> str | None:
    try:
        obj = json.loads(value)
    except (ValueError, RecursionError):
        return None
    rid = obj.get("request_id") if isinstance(obj, dict) else None
    return rid if isinstance(rid, str) else None


def _answered(sent: tuple[str, int, int, set[str]], answered: set[str]) -> bool:
    """A record that decoded fine was answered under its request_id (header, or the body's own)."""
    return bool(sent[3] & answered)
