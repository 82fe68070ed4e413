"""Dead letters keep no secrets and always fit their topic; a record's own fault is dead-lettered
once, never retried forever (a reply_to the stage may not write to, an output the producer refuses)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from types import SimpleNamespace

import orjson
import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka import errors as kafka
from aiokafka.structs import ConsumerRecord

from pipeline.app.assemble import topology_for
from pipeline.contracts import DlqRecord, ReplyTo, RequestDoc, Response
from pipeline.contracts.request import ChatBody, ChatMessage
from pipeline.runtime import errors
from pipeline.runtime import worker as worker_mod
from pipeline.runtime.dlq import MAX_KEPT_BYTES, dead_letter, redact_key
from pipeline.runtime.handler import Item
from pipeline.runtime.stage_handler import StageHandler
from pipeline.runtime.topics import TopicNames
from pipeline.runtime.worker import StageWorker
from tests.support.kafka import settings_for


def record(value: bytes) -> ConsumerRecord:
    return ConsumerRecord(topic="t.requests", partition=0, offset=7, timestamp=1, timestamp_type=0, key=b"k",
                          value=value, checksum=None, serialized_key_size=1, serialized_value_size=len(value),
                          headers=[("request_id", b"r1")])


def test_the_api_key_is_removed_before_anything_is_kept():
    doc = {"schema": "request/v1", "request_id": "r1", "api_key": "lp-supersecret", "body": {"messages": "bad"}}
    dl = dead_letter(record(orjson.dumps(doc)), stage="mask", worker="w", error_class="schema_invalid",
                     error="body.messages", attempts=0)
    kept = orjson.loads(dl.original_value())
    assert kept["api_key"] is None and kept["body"] == doc["body"] and dl.redacted == ["api_key"]
    assert "supersecret" not in DlqRecord.model_validate_json(dl.model_dump_json()).model_dump_json()
    assert dl.value_sha256 == hashlib.sha256(orjson.dumps(doc)).hexdigest()
    # not JSON at all (truncated, say): the key is still blanked textually
    raw = b'{"request_id": "r2", "api_key": "lp-other\\"secret", "body": {'
    dl2 = dead_letter(record(raw), stage="mask", worker="w", error_class="undecodable", error="x", attempts=0)
    assert b"lp-other" not in dl2.original_value() and dl2.redacted == ["api_key"]
    clean = b'{"request_id": "r3"}'
    dl3 = dead_letter(record(clean), stage="mask", worker="w", error_class="x", error="x", attempts=0)
    assert dl3.original_value() == clean and dl3.redacted == [] and not dl3.value_truncated
    for value in (b'{"request_id": "r", "api_key": null,  "x": [1, 2.50]}', b"\xff not json", b'{"k": "api_key"}'):
        assert redact_key(value) == (value, [])  # nothing to remove: byte for byte


def test_an_oversize_record_is_kept_truncated_with_its_digest():
    value = b"x" * (MAX_KEPT_BYTES * 3)
    dl = dead_letter(record(value), stage="grow", worker="w", error_class="too_large", error="x", attempts=1)
    assert dl.value_truncated and dl.value_bytes == len(value)
    assert dl.value_sha256 == hashlib.sha256(value).hexdigest()
    assert len(base64.b64decode(dl.value_b64)) == MAX_KEPT_BYTES
    assert len(dl.model_dump_json()) < 2 * MAX_KEPT_BYTES  # fits any topic configured for requests


def test_the_door_limit_must_leave_room_for_the_document_to_grow():
    import pytest

    from pipeline.config.settings import DOC_GROWTH_BYTES, Settings

    s = Settings()
    assert s.http.max_body_bytes + DOC_GROWTH_BYTES <= s.producer.max_request_size
    with pytest.raises(ValueError, match="must be at least"):
        Settings(http={"max_body_bytes": 8 << 20}, producer={"max_request_size": 8 << 20})


@pytest.mark.parametrize("value, secrets", [
    # orjson keeps a duplicated key's last value: this one looked clean and kept the key
    (b'{"request_id": "r1", "api_key": "lp-dup-secret", "api_key": null}', ["lp-dup-secret"]),
    (b'{"request_id": "r1", "api\\u005fkey": "lp-escaped-secret"}', ["lp-escaped-secret"]),
    (b'{"body": {"messages": [{"role": "user", "API_KEY": "lp-nested-secret"}]}}', ["lp-nested-secret"]),
    (b'{"caller_assertion": "v1.signed-claims", "caller_assertion": "v1.other-claims"}',
     ["v1.signed-claims", "v1.other-claims"]),
    (b'{"api_key": {"inner": "lp-object-secret"}, "x": 1}', ["lp-object-secret"]),
    # not JSON (cut short): blanked textually, escaped names too
    (b'{"request_id": "r2", "api\\u005fkey": "lp-cut-secret", "caller_assertion": "v1.cut-cla', ["lp-cut-secret", "v1.cut-cla"]),
])
def test_every_secret_field_is_removed_whatever_the_json_shape(value, secrets):
    dl = dead_letter(record(value), stage="mask", worker="w", error_class="schema_invalid", error="x", attempts=0)
    kept = dl.original_value()
    for secret in secrets:
        assert secret.encode() not in kept, kept
    assert dl.redacted and dl.value_sha256 == hashlib.sha256(value).hexdigest()
    try:
        json.loads(value)
    except ValueError:
        return
    assert json.loads(kept) is not None  # JSON in, JSON out


# ---- reply_to and the record's own faults ---------------------------------------------------------

class StubProducer:
    """aiokafka 0.14's own partition check (AIOKafkaProducer._partition: `assert partition in
    partitions_for_topic(topic), "Unrecognized partition"`), run before any byte reaches a broker;
    every send is recorded. A topic it does not know has 4 partitions (Tansu auto-creates it)."""

    def __init__(self, partitions: dict[str, int]) -> None:
        self.parts = partitions
        self.sent: list[tuple[str, int | None, bytes | None]] = []
        self.refreshes = 0
        self._metadata = SimpleNamespace(partitions_for_topic=lambda t: set(range(self.parts.get(t, 4))))
        self.client = SimpleNamespace(force_metadata_update=self._refresh)

    async def _refresh(self) -> bool:
        self.refreshes += 1
        return True

    async def partitions_for(self, topic: str) -> set[int]:
        return self._metadata.partitions_for_topic(topic)

    async def send(self, topic, value=None, key=None, partition=None, timestamp_ms=None, headers=None):
        if partition is not None:
            AIOKafkaProducer._partition(self, topic, partition, key, value, key, value)
        self.sent.append((topic, partition, value))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut


def _item(topic: str, value: bytes, offset: int) -> Item:
    rec = ConsumerRecord(topic=topic, partition=0, offset=offset, timestamp=1, timestamp_type=0, key=None,
                         value=value, checksum=None, serialized_key_size=0, serialized_value_size=len(value), headers=[])
    return Item(TopicPartition(topic, 0), rec, 1)


def _doc(rid: str, reply: dict | None) -> bytes:
    d = RequestDoc(request_id=rid, body=ChatBody(messages=[ChatMessage(role="user", content="hi")]))
    obj = orjson.loads(d.model_dump_json(by_alias=True))
    obj["reply_to"] = reply
    return orjson.dumps(obj)


async def test_a_reply_to_anywhere_but_a_partition_of_responses_is_refused_once(tmp_path):
    """Issue 35, finding 3: the bare record with partition 99999 made the salvaged answer raise
    AssertionError, retried forever; a foreign topic had the stage write there for the sender."""
    s = settings_for(tmp_path, "t.", None, [{"name": "answer", "class": "tests.stages:Answer"}])
    names, topo = TopicNames("t."), topology_for(s)
    handler = StageHandler(topo.build("answer"), topo, names, "w")
    producer = StubProducer({names.responses: 12, names.requests: 6, names("admit.state"): 6})
    await handler.start(producer)  # type: ignore[arg-type]
    poison = {
        "bare-far": orjson.dumps({"request_id": "bare-far", "reply_to": {"topic": names.responses, "partition": 99999}}),
        "bare-foreign": orjson.dumps({"request_id": "bare-foreign", "reply_to": {"topic": names("admit.state"), "partition": 0}}),
        "bare-odd": orjson.dumps({"request_id": "bare-odd", "reply_to": "llmpipe.responses"}),
        "doc-far": _doc("doc-far", {"topic": names.responses, "partition": 99999}),
        "doc-state": _doc("doc-state", {"topic": names("admit.state"), "partition": 0}),
        "doc-requests": _doc("doc-requests", {"topic": names.requests, "partition": 1}),
        "doc-negative": _doc("doc-negative", {"topic": names.responses, "partition": -1}),
        "doc-odd": _doc("doc-odd", [1, 2]),  # type: ignore[arg-type]
    }
    good = _doc("good", {"topic": names.responses, "partition": 11})
    items = [_item(names.requests, v, i) for i, v in enumerate([*poison.values(), good])]
    async with asyncio.timeout(10):
        await handler.handle(items)

    written = {t for t, _, _ in producer.sent}
    assert written <= {names.responses, names.dlq, names.evidence}, written  # never admit.state, never requests
    answers = [(p, Response.model_validate_json(v)) for t, p, v in producer.sent if t == names.responses]
    by_id: dict[str, list] = {}
    for p, r in answers:
        by_id.setdefault(r.request_id, []).append((p, r))
    assert set(by_id) == {*poison, "good"}
    assert all(len(v) == 1 for v in by_id.values()), by_id  # one answer each
    assert by_id["good"][0][0] == 11 and by_id["good"][0][1].status == "ok"
    for rid in ("doc-far", "doc-state", "doc-requests"):
        (partition, r), = by_id[rid]
        assert partition is None and r.status == "error" and r.error_class == "invalid_reply_to", r
        assert "reply_to names" in (r.reason or "")
    assert "99999" in by_id["doc-far"][0][1].reason and "admit.state" in by_id["doc-state"][0][1].reason
    assert all(by_id[rid][0][0] is None for rid in poison)  # on `responses` by key, never the asked partition
    dlq = [DlqRecord.model_validate_json(v) for t, _, v in producer.sent if t == names.dlq]
    assert len(dlq) == len(poison)


class _Batchy:
    """A handler whose batches fail while they hold a bad record (with `error`), or fail with
    `flaky` the first `flaky_times` calls."""

    name, max_batch, max_wait_ms, concurrency = "unit", 10, 0, 1

    def __init__(self, error: BaseException | None = None, flaky: BaseException | None = None, flaky_times: int = 0):
        self.error, self.flaky, self.flaky_times = error, flaky, flaky_times
        self.calls: list[list[int]] = []
        self.given_up: list[tuple[int, str]] = []

    async def handle(self, items: list[Item]) -> None:
        offsets = [it.record.offset for it in items]
        self.calls.append(offsets)
        if self.flaky is not None and len(self.calls) <= self.flaky_times:
            raise self.flaky
        if self.error is not None and 13 in offsets:
            raise self.error

    async def give_up(self, it: Item, exc: BaseException) -> None:
        self.given_up.append((it.record.offset, type(exc).__name__))


async def _run(handler: _Batchy, monkeypatch) -> None:
    real_sleep = asyncio.sleep

    async def no_wait(_s: float) -> None:
        await real_sleep(0)  # no backoff, but a turn of the loop: the timeout below can fire

    monkeypatch.setattr(worker_mod.asyncio, "sleep", no_wait)
    w = StageWorker.__new__(StageWorker)
    w.handler, w.metrics = handler, worker_mod.StageMetrics("unit")
    async with asyncio.timeout(10):  # today's code retries a record's own fault forever
        await w._handle_until_done([_item("t.requests", b"{}", o) for o in (12, 13, 14)])


async def test_the_worker_gives_up_on_a_records_fault_and_waits_out_the_infrastructure(monkeypatch):
    assertion = AssertionError("Unrecognized partition")
    h = _Batchy(error=assertion)
    await _run(h, monkeypatch)
    assert h.given_up == [(13, "AssertionError")]  # the bad record alone, at once
    assert h.calls == [[12, 13, 14], [12], [13], [14]]  # the good ones handled again, alone

    h = _Batchy(error=RuntimeError("neither the record's nor the broker's"))
    await _run(h, monkeypatch)
    assert h.given_up == [(13, "RuntimeError")]
    tries = worker_mod.UNKNOWN_TRIES
    assert h.calls.count([13]) == tries and h.calls[:tries] == [[12, 13, 14]] * tries

    h = _Batchy(flaky=kafka.KafkaConnectionError("broker down"), flaky_times=3 * tries)
    await _run(h, monkeypatch)  # a broker outage: retried for as long as it lasts, nothing given up
    assert h.given_up == [] and len(h.calls) == 3 * tries + 1


def test_errors_are_the_records_or_the_infrastructures():
    producer = StubProducer({"t.responses": 12})
    with pytest.raises(AssertionError) as far:
        AIOKafkaProducer._partition(producer, "t.responses", 99999, None, b"", None, b"")
    record = [far.value, kafka.MessageSizeTooLargeError(), ValueError("schema"), UnicodeEncodeError("utf-8", "x", 0, 1, "no"),
              orjson.JSONEncodeError("not serialisable")]
    infra = [kafka.KafkaConnectionError(), kafka.KafkaTimeoutError(), kafka.NodeNotReadyError(),
             kafka.RequestTimedOutError(), kafka.NotLeaderForPartitionError(), ConnectionResetError(), TimeoutError()]
    neither = [kafka.UnknownError(), RuntimeError("?")]
    is_infra, is_record = errors.is_infrastructure, errors.is_record_fault
    assert all(is_record(e) and not is_infra(e) for e in record)
    assert all(is_infra(e) and not is_record(e) for e in infra)
    assert not any(is_infra(e) or is_record(e) for e in neither)


async def test_the_reply_check_refreshes_metadata_once_before_refusing_a_partition():
    from pipeline.runtime.outputs import ReplyCheck

    producer = StubProducer({"t.responses": 12})
    check = ReplyCheck(producer, "t.responses")  # type: ignore[arg-type]
    assert await check.problem(ReplyTo(topic="t.responses", partition=11)) is None
    assert producer.refreshes == 0
    producer.parts["t.responses"] = 24  # grown since the metadata was read: found after one refresh
    producer._metadata = SimpleNamespace(partitions_for_topic=lambda t: set(range(12)))
    grown = {"n": 0}

    async def refresh() -> bool:
        grown["n"] += 1
        producer._metadata = SimpleNamespace(partitions_for_topic=lambda t: set(range(24)))
        return True

    producer.client = SimpleNamespace(force_metadata_update=refresh)
    assert await check.problem(ReplyTo(topic="t.responses", partition=20)) is None and grown["n"] == 1
    problem = await check.problem(ReplyTo(topic="t.responses", partition=99999))
    assert problem is not None and "99999" in problem and "0-23" in problem
    assert grown["n"] == 1  # at most one refresh per METADATA_REFRESH_S: a flood of bad partitions costs none
    assert "'t.admit.state'" in (await check.problem(ReplyTo(topic="t.admit.state", partition=0)) or "")
    assert "not allowed" in (await check.problem(ReplyTo(topic="x" * 300, partition=0)) or "")
