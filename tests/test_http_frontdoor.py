"""The OpenAI-compatible front door on the running stack (`llmpipe up --processes`, real vLLM), called
with the official `openai` client: completions, streamed chunks, logprobs, JSON-schema output,
images, idempotency keys, and every error status a caller can meet. Streaming: tokens arrive as
they are generated, PII restored whole in them, a caller who leaves stops the engine, and a
generate worker killed mid-stream shows the caller no text twice."""

from __future__ import annotations

import base64
import io
import json
import time

import httpx
import openai
import pytest
from PIL import Image

from tests.support.cli import last_json, llmpipe
from tests.support.product import BROKEN
from tests.support.warehouse import rows_when as _rows_when

pytestmark = pytest.mark.integration

@pytest.fixture(scope="module")
def door(product_stack):
    """The shared product stack (tests/support/product.py): the front door's tenants are acme, tight
    (rpm 1), other and slots (concurrency 2)."""
    return product_stack.info, product_stack.keys, product_stack.data_dir


def client(info, key: str | None, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=info["http_url"] + "/v1", api_key=key or "none", max_retries=0, timeout=300, **kw)


def status_of(exc_info) -> tuple[int, dict]:
    err = exc_info.value
    return err.status_code, err.body


def png_data_url() -> str:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_completion_stream_logprobs_schema_and_idempotency(door):
    info, keys, _ = door
    assert info["http_url"].startswith("http://127.0.0.1:")
    c = client(info, keys["acme"])
    msgs = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    r = c.chat.completions.create(model="small", messages=msgs, max_tokens=12, temperature=0, seed=7)
    text = r.choices[0].message.content
    assert r.object == "chat.completion" and "Paris" in text, r
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.model == "smollm2-135m-instruct"  # the model that ran, not the one asked for
    ext = r.model_extra["llmpipe"]
    assert ext["route"] == "simple" and ext["deployment"] == "local-vllm" and ext["cache"] == "miss"

    # streaming: role first, then deltas that concatenate to the answer, then the finish, then usage
    chunks = list(c.chat.completions.create(model="small", messages=msgs, max_tokens=12, temperature=0, seed=7,
                                            stream=True, stream_options={"include_usage": True}))
    assert len(chunks) >= 4 and all(ch.object == "chat.completion.chunk" for ch in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert streamed == text  # the same answer (generated again, or served by the cache)
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert len(finishes) == 1 and chunks[-1].choices == [] and chunks[-1].usage is not None
    assert len({ch.id for ch in chunks}) == 1

    # logprobs: one per generated token, spelled by the model's tokenizer
    lp = c.chat.completions.create(model="small", messages=[{"role": "user", "content": "Say a number."}],
                                   max_tokens=5, logprobs=True, seed=3, temperature=0.7)
    entries = lp.choices[0].logprobs.content
    assert len(entries) == lp.usage.completion_tokens and all(e.logprob <= 0 for e in entries)
    assert "".join(e.token for e in entries).strip() == lp.choices[0].message.content.strip()

    # JSON-schema output
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
              "additionalProperties": False}
    js = c.chat.completions.create(model="small", messages=[{"role": "user", "content": "Capital of Italy as JSON."}],
                                   max_tokens=30, response_format={"type": "json_schema",
                                                                   "json_schema": {"name": "c", "schema": schema}})
    assert set(json.loads(js.choices[0].message.content)) == {"city"}

    # an image part: media decodes it, vision describes it, the text model answers
    img = c.chat.completions.create(model="small", max_tokens=8, messages=[{"role": "user", "content": [
        {"type": "text", "text": "What colour is this picture?"},
        {"type": "image_url", "image_url": {"url": png_data_url()}}]}])
    assert img.choices[0].message.content and set(img.model_extra["llmpipe"]["timings"]) >= {"media", "vision"}

    # the same Idempotency-Key twice: one execution, the second is the first's answer
    once = [c.chat.completions.create(model="small", messages=[{"role": "user", "content": "Tell me a colour."}],
                                      max_tokens=6, temperature=1.0, extra_headers={"Idempotency-Key": "order-42"})
            for _ in range(2)]
    assert once[0].choices[0].message.content == once[1].choices[0].message.content
    assert once[1].model_extra["llmpipe"]["duplicate_of"] == once[0].model_extra["llmpipe"]["request_id"]

    health = httpx.get(info["http_url"] + "/healthz")
    assert health.status_code == 200
    metrics = httpx.get(info["http_url"] + "/metrics").text
    assert 'llmpipe_http_requests_total{status="200"}' in metrics
    assert keys["acme"] not in metrics


def test_error_statuses(door):
    info, keys, data_dir = door
    hello = [{"role": "user", "content": "Say hello"}]

    with pytest.raises(openai.AuthenticationError) as e:  # 401: unknown key, no key
        client(info, "lp-not-a-key").chat.completions.create(model="m", messages=hello)
    assert status_of(e)[0] == 401 and e.value.body["code"] == "unauthenticated"
    no_key = httpx.post(info["http_url"] + "/v1/chat/completions", json={"messages": hello}, timeout=60)
    assert no_key.status_code == 401 and no_key.json()["error"]["code"] == "unauthenticated"

    acme = client(info, keys["acme"])
    with pytest.raises(openai.UnprocessableEntityError) as e:  # 422: invalid body
        acme.chat.completions.create(model="m", messages=hello, temperature=-1)
    assert e.value.body["code"] == "invalid_request" and "temperature" in e.value.body["message"]
    with pytest.raises(openai.UnprocessableEntityError) as e:  # 422: a parameter we cannot honour
        acme.chat.completions.create(model="m", messages=hello, logprobs=True, top_logprobs=2, stream=True)
    assert "`top_logprobs` with `stream` is not supported" in e.value.body["message"]

    with pytest.raises(openai.APIStatusError) as e:  # 413: a prompt over the tenant's size limit (mask)
        acme.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 40_000}])
    assert e.value.status_code == 413 and e.value.body["code"] == "too_large"
    big = httpx.post(info["http_url"] + "/v1/chat/completions", headers={"Authorization": f"Bearer {keys['acme']}"},
                     content=b"{" + b" " * (9 << 20) + b"}", timeout=60)
    assert big.status_code == 413 and big.json()["error"]["code"] == "body_too_large"

    # 403: another tenant's blob
    pic = data_dir / "pic.png"
    pic.write_bytes(base64.b64decode(png_data_url().split(",", 1)[1]))
    put = llmpipe("blobs", "put", str(pic), "--tenant", "acme", "--json", data_dir=data_dir)
    assert put.returncode == 0, put.stderr
    ref = last_json(put)["ref"]
    with pytest.raises(openai.PermissionDeniedError) as e:
        client(info, keys["other"]).chat.completions.create(model="m", messages=[{"role": "user", "content": [
            {"type": "text", "text": "Describe"}, {"type": "image_url", "image_url": {"url": ref}}]}])
    assert e.value.body["code"] == "blob_forbidden"

    tight = client(info, keys["tight"])  # 429 with Retry-After: rpm 1
    tight.chat.completions.create(model="m", messages=hello, max_tokens=4)
    with pytest.raises(openai.RateLimitError) as e:
        tight.chat.completions.create(model="m", messages=hello, max_tokens=4)
    assert e.value.body["code"] == "rate_limited"
    assert 1 <= int(e.value.response.headers["retry-after"]) <= 61

    with pytest.raises(openai.APIStatusError) as e:  # 504: a deadline nobody can meet
        acme.chat.completions.create(model="m", messages=hello, extra_body={"llmpipe": {"timeout_s": 0.001}})
    assert e.value.status_code == 504 and e.value.body["code"] == "deadline_exceeded"

    with pytest.raises(openai.APIStatusError) as e:  # 502: the only deployment refuses connections
        acme.chat.completions.create(model="m", messages=[{"role": "user", "content": BROKEN}], max_tokens=4)
    assert e.value.status_code == 502 and e.value.body["code"] == "connection_refused", e.value.body
    with pytest.raises(openai.APIStatusError) as e:  # 503: no deployment of the route can do JSON schema
        acme.chat.completions.create(model="m", messages=[{"role": "user", "content": BROKEN}], max_tokens=4,
                                     response_format={"type": "json_object"})
    assert e.value.status_code == 503 and e.value.body["code"] == "no_compatible_deployment", e.value.body


def test_adapters_are_authorised_per_tenant_and_registered_live(door):
    info, keys, data_dir = door
    ask = [{"role": "user", "content": "I want a refund"}]
    with pytest.raises(openai.PermissionDeniedError) as e:  # 403: the tenant may not use the adapter
        client(info, keys["other"]).chat.completions.create(model="support-lora", messages=ask, max_tokens=4)
    assert e.value.body["code"] == "adapter_forbidden"
    # authorised, but this stack's deployment serves no LoRA adapters: refused, never run on the base
    # model in the adapter's name (tests/test_lora_serving.py runs them)
    with pytest.raises(openai.InternalServerError) as e:
        client(info, keys["acme"]).chat.completions.create(model="support-lora", messages=ask, max_tokens=4)
    assert e.value.status_code == 503 and e.value.body["code"] == "no_compatible_deployment"
    assert "serves no LoRA adapters" in e.value.body["message"]
    rows = _rows_when(data_dir, "SELECT stage, decision, labels FROM decisions FINAL WHERE stage IN "
                                "('admit', 'route') AND labels['adapter'] != '' ORDER BY stage",
                      lambda rows: ("admit", "refused") in {(r["stage"], r["decision"]) for r in rows}
                      and any(r["stage"] == "route" for r in rows))  # the sink writes in batches
    assert {r["labels"]["adapter"] for r in rows if r["stage"] == "route"} == {"support-lora"}

    # a second adapter, registered while the stack runs: refused outside the allowed roots, else live
    outside = data_dir / "elsewhere"
    outside.mkdir()
    (outside / "adapter_config.json").write_text("{}")
    cfg = str(data_dir / "llmpipe.yaml")  # the operator's config: it names the allowed adapter roots
    bad = llmpipe("adapters", "register", "rogue-lora", "--path", str(outside), "--revision", "r1", "--rank", "4",
                  "--tenant", "*", "--config", cfg, data_dir=data_dir)
    assert bad.returncode != 0 and "outside the allowed adapter roots" in bad.stderr
    reg = llmpipe("adapters", "register", "spare-lora", "--path", str(data_dir / "adapters" / "spare-lora"),
                  "--revision", "r2", "--rank", "8", "--tenant", "other", "--config", cfg, "--json", data_dir=data_dir)
    assert reg.returncode == 0, reg.stderr
    assert llmpipe("adapters", "promote", "spare-lora", "--to", "warm", data_dir=data_dir).returncode == 0
    listed = {r["name"]: r for r in last_json(llmpipe("adapters", "list", "--config", cfg, "--json", data_dir=data_dir))}
    assert listed["spare-lora"]["state"] == "warm" and listed["spare-lora"]["problem"] is None
    assert listed["support-lora"]["tenants"] == ["acme"]
    deadline = time.monotonic() + 60
    while True:  # admit follows control: `other` passes admit once it has applied the registration
        try:
            client(info, keys["other"]).chat.completions.create(model="spare-lora", messages=ask, max_tokens=4)
            raise AssertionError("no deployment here serves LoRA adapters")
        except openai.APIStatusError as exc:
            if exc.body["code"] == "no_compatible_deployment":  # authorised by admit and generate's registry
                break
            assert exc.body["code"] in ("adapter_unavailable", "adapter_forbidden") and time.monotonic() < deadline
            time.sleep(1)


class _Records(list):
    """A topic's records; in a wait's failure message, how many (not each record)."""

    def __repr__(self) -> str:
        return f"<{len(self)} records, none of them the one awaited>"


def _bytes_of(rec) -> bytes:
    return (rec.key or b"") + (rec.value or b"") + b"".join(k.encode() + (v or b"") for k, v in rec.headers or ())


def test_no_api_key_rests_on_any_topic(door):
    """The door publishes its signed caller assertion, never the key; mask strips the assertion. Each
    topic scanned first holds a record this test caused (an empty read proves nothing)."""
    import asyncio
    import uuid

    import orjson
    from aiokafka import AIOKafkaProducer

    from tests.support.kafka import read_until_quiet
    from tests.support.waits import poll

    info, keys, _ = door
    prefix, bootstrap = info["topic_prefix"], info["bootstrap"]
    mark = uuid.uuid4().hex[:10]
    # a prompt no test asked (a cache hit would skip route) and an idempotency key (admit writes a claim)
    r = client(info, keys["other"]).chat.completions.create(
        model="small", messages=[{"role": "user", "content": f"Say hi to agent {mark}."}], max_tokens=3,
        extra_headers={"Idempotency-Key": f"leak-{mark}"})
    assert r.choices[0].message.content is not None and r.model_extra["llmpipe"]["cache"] != "hit"
    rid = r.model_extra["llmpipe"]["request_id"].encode()

    async def poison() -> tuple[int, int]:  # fault injection: bytes route cannot read go to the DLQ
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await p.start()
        try:
            meta = await p.send_and_wait(prefix + "stage.route", b"\xffnot a request " + mark.encode(),
                                         key=mark.encode())
            return meta.partition, meta.offset
        finally:
            await p.stop()

    where = asyncio.run(poison())

    def dead_letter_of_poison(rec) -> bool:
        d = orjson.loads(rec.value)
        return (d["topic"], d["partition"], d["offset"]) == (prefix + "stage.route", *where)

    def ours(rec) -> bool:
        return rid in _bytes_of(rec)

    # (cache runs in mask's chain: mask hands it the request in memory, nothing lands on stage.cache)
    awaited = {"requests": ours, "stage.route": ours, "responses": ours, "evidence": ours,
               "admit.state": ours, "dlq": dead_letter_of_poison}
    for topic, want in awaited.items():
        records = poll(lambda topic=topic: _Records(asyncio.run(read_until_quiet(bootstrap, prefix + topic, quiet_s=1,
                                                                                timeout=15))),
                       lambda recs, want=want: any(want(rec) for rec in recs), 60, f"{topic}: a record this test caused")
        blob = b"".join(_bytes_of(rec) for rec in records)
        leaked = [t for t, k in keys.items() if k.encode() in blob]
        assert not leaked, (topic, leaked)
        if topic == "requests":
            assert all(b'"caller_assertion":"a2.' in rec.value for rec in records)
            assert all(b'"api_key":null' in rec.value or b'"api_key"' not in rec.value for rec in records)
        if topic.startswith("stage."):
            assert all(b'"caller_assertion":null' in rec.value or b"caller_assertion" not in rec.value
                       for rec in records)


def _deltas_of(info, request_id: str, data_dir) -> list[dict]:
    """The request's deltas as the door reads them (generate seals them: `stream.seal`)."""
    import asyncio

    from pipeline.contracts.stream import Delta
    from pipeline.security.sealing import Keyring, open_delta
    from tests.support.kafka import read_topic

    keyring = Keyring.local(data_dir / "secrets")
    records = asyncio.run(read_topic(info["bootstrap"], info["topic_prefix"] + "deltas", 1_000_000, timeout=3))
    return [open_delta(d, keyring).model_dump(mode="json", by_alias=True) for rec in records
            if (d := Delta.model_validate_json(rec.value)).request_id == request_id]


def test_stream_tokens_arrive_as_generated_with_pii_restored_whole(door):
    info, keys, data_dir = door
    c = client(info, keys["acme"])
    t0 = time.perf_counter()
    arrivals, usage, rid = [], None, None
    for ch in c.chat.completions.create(model="small", max_tokens=96, temperature=0, stream=True,
                                        stream_options={"include_usage": True},
                                        messages=[{"role": "user", "content": "Count from 1 to 100, separated by commas."}]):
        rid = ch.id.removeprefix("chatcmpl-")
        if ch.choices and ch.choices[0].delta.content:
            arrivals.append((time.perf_counter() - t0, ch.choices[0].delta.content))
        usage = ch.usage or usage
    total = time.perf_counter() - t0
    assert usage is not None and usage.completion_tokens >= 64
    assert arrivals[0][0] < total / 2, (arrivals[0][0], total)  # the first text long before the end
    assert len(arrivals) >= 8  # pieces as they came, not the finished answer at once
    deltas = _deltas_of(info, rid, data_dir)
    assert "".join(d["text"] for d in deltas) == "".join(t for _, t in arrivals)  # nothing added or lost
    assert sum(len(d["token_ids"]) for d in deltas) == usage.completion_tokens
    row = _rows_when(data_dir, f"SELECT scores FROM decisions FINAL WHERE request_id = '{rid}' AND stage = 'frontdoor'",
                     lambda rows: bool(rows))
    assert row and 0 < row[0]["scores"]["caller_ttft_ms"] < total * 1000 and row[0]["scores"]["chunks"] == len(arrivals)

    # a name the model echoes: it saw a placeholder (split over several tokens), the caller sees the name
    chunks = [ch for ch in c.chat.completions.create(
        model="small", max_tokens=24, temperature=0, stream=True,
        messages=[{"role": "user", "content": "Say exactly this and nothing else: Hello John Smith"}])]
    texts = [ch.choices[0].delta.content or "" for ch in chunks if ch.choices]
    rid = chunks[0].id.removeprefix("chatcmpl-")
    assert "John Smith" in "".join(texts), texts
    assert not any("<" in t or "PERSON" in t for t in texts), texts  # no placeholder, whole or in part
    masked = _rows_when(data_dir, f"SELECT scores FROM decisions FINAL WHERE request_id = '{rid}' AND stage = 'mask'",
                        bool)  # the sink writes in batches
    assert masked and masked[0]["scores"].get("entities.PERSON") == 1.0, masked  # the model saw a placeholder
    held = [d for d in _deltas_of(info, rid, data_dir) if d["text"] == "" and d["token_ids"]]
    assert held, "the placeholder's tokens were held back until it was whole"

    # a JSON-schema answer cut short by max_tokens: its text streamed, then the end is an error event
    schema = {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"],
              "additionalProperties": False}
    got = []
    with pytest.raises(openai.APIError) as e:
        for ch in c.chat.completions.create(
                model="small", max_tokens=4, stream=True, messages=[{"role": "user", "content": "A story as JSON."}],
                response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}):
            got.append(ch.choices[0].delta.content or "" if ch.choices else "")
    assert e.value.code == "schema_invalid" and "JSON schema" in e.value.message
    assert "".join(got).startswith("{"), got  # the text came first, as it was generated; never repaired


def test_python_client_stream_concatenates_to_the_terminal_text(door):
    import asyncio
    from pathlib import Path

    from pipeline.contracts.request import ChatBody, ChatMessage
    from pipeline.ingress.client import Client
    from pipeline.ingress.stream_follow import Ended
    from pipeline.security.sealing import Keyring

    info, keys, data_dir = door

    async def run():
        async with Client(info["bootstrap"], topic_prefix=info["topic_prefix"],
                          doorbell_dir=Path(info["doorbell_dir"])) as cl:
            cl.delta_keyring = Keyring.local(data_dir / "secrets")  # generate seals deltas; this client may open them
            body = ChatBody(messages=[ChatMessage(role="user", content="Name five fruits, one per line.")],
                            max_tokens=48, temperature=0)
            events = [ev async for ev in cl.stream(cl.build(body=body, api_key=keys["acme"], timeout_s=120), 120)]
        return events

    events = asyncio.run(run())
    end = events[-1]
    assert isinstance(end, Ended) and end.ok and end.response.status.value == "ok"
    pieces = [ev for ev in events[:-1]]
    assert len(pieces) >= 4 and "".join(p.text for p in pieces) == end.response.text
    assert {p.attempt for p in pieces if p.attempt} and len({p.attempt for p in pieces if p.attempt}) == 1


def test_a_caller_who_leaves_stops_the_engine_and_frees_the_slot(door):
    info, keys, data_dir = door
    body = {"model": "small", "max_tokens": 512, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": "Write a very long story about a dragon."}]}
    headers = {"Authorization": f"Bearer {keys['slots']}"}
    seen = 0
    with httpx.Client(timeout=120) as h, h.stream("POST", info["http_url"] + "/v1/chat/completions", json=body,
                                                 headers=headers) as r:
        assert r.status_code == 200
        rid = r.headers["x-request-id"]
        for line in r.iter_lines():
            if line.startswith("data: ") and '"content":"' in line and '"content":""' not in line:
                seen += 1
                if seen == 5:
                    break
    left_ms = int(time.time() * 1000)  # the connection is closed here
    rows = _rows_when(data_dir, f"SELECT status, error_class, tokens_out FROM requests FINAL WHERE request_id = '{rid}'",
                      lambda rows: bool(rows))
    assert rows and rows[0]["status"] == "cancelled" and rows[0]["error_class"] == "cancelled"
    deltas = _deltas_of(info, rid, data_dir)
    after = [d for d in deltas if d["at_ms"] > left_ms]
    tokens_after = sum(len(d["token_ids"]) for d in after)
    stopped_ms = max(d["at_ms"] for d in deltas) - left_ms
    # the engine stopped within 1 s of the disconnect, far short of 512 tokens
    assert stopped_ms < 1000 and rows[0]["tokens_out"] < 100, (stopped_ms, tokens_after, rows)
    ev = _rows_when(data_dir, f"SELECT stage, decision, scores FROM decisions FINAL WHERE request_id = '{rid}' "
                              "AND stage IN ('generate', 'frontdoor') AND step = 0 ORDER BY stage", lambda r: len(r) >= 2)
    assert [(e["stage"], e["decision"]) for e in ev] == [("frontdoor", "streamed"), ("generate", "cancelled")]
    assert ev[1]["scores"]["tokens_out"] == rows[0]["tokens_out"]
    # the tenant's two concurrency slots are free again: a burst of two is admitted in full
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        burst = list(pool.map(lambda i: client(info, keys["slots"]).chat.completions.create(
            model="small", max_tokens=4, messages=[{"role": "user", "content": f"Say the number {i}."}]), range(2)))
    assert all(b.choices[0].message.content is not None for b in burst)


def test_feedback_lands_once_from_http_and_kafka_only_from_the_owner_and_masked(door):
    import asyncio

    from pipeline.contracts import Feedback
    from pipeline.ingress import Client

    info, keys, data_dir = door
    url = info["http_url"]

    def post(key: str, body: dict) -> httpx.Response:
        return httpx.post(f"{url}/v1/feedback", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)

    answer = httpx.post(f"{url}/v1/chat/completions", timeout=300,
                        headers={"Authorization": f"Bearer {keys['acme']}", "x-llmpipe-episode-id": "ep-fb-1"},
                        json={"model": "small", "max_tokens": 4, "messages": [{"role": "user", "content": "Say hi"}]})
    assert answer.status_code == 200, answer.text
    rid = answer.headers["x-request-id"]

    thumbs = {"request_id": rid, "metric": "thumbs_up", "value": False, "feedback_id": "fb-http-1"}
    assert [post(keys["acme"], thumbs).status_code for _ in range(2)] == [200, 200]  # a retry is fine
    assert post(keys["acme"], thumbs).json() == {"feedback_id": "fb-http-1"}
    comment = post(keys["acme"], {"request_id": rid, "metric": "comment",
                                  "value": "wrong answer, mail me at jane.doe@example.com"})
    assert comment.status_code == 200, comment.text
    assert post(keys["acme"], {"episode_id": "ep-fb-1", "metric": "task_success", "value": True}).status_code == 200

    refusals = {
        "other tenant": (post(keys["other"], {"request_id": rid, "metric": "thumbs_up", "value": True}), 403,
                         "forbidden"),
        "unknown request": (post(keys["acme"], {"request_id": "nope", "metric": "thumbs_up", "value": True}), 404,
                            "unknown_target"),
        "unknown episode": (post(keys["acme"], {"episode_id": "ep-none", "metric": "task_success", "value": True}),
                            404, "unknown_target"),
        "unknown metric": (post(keys["acme"], {"request_id": rid, "metric": "stars", "value": 5}), 422,
                           "unknown_metric"),
        "wrong type": (post(keys["acme"], {"request_id": rid, "metric": "thumbs_up", "value": "yes"}), 422,
                       "invalid_feedback"),
        "wrong level": (post(keys["acme"], {"request_id": rid, "metric": "task_success", "value": True}), 422,
                        "invalid_feedback"),
        "both targets": (post(keys["acme"], {"request_id": rid, "episode_id": "ep-fb-1", "metric": "rating",
                                             "value": 1}), 422, "invalid_request"),
        "own tenant claimed": (post(keys["acme"], {"request_id": rid, "metric": "rating", "value": 1,
                                                   "tenant_id": "other"}), 422, "invalid_request"),
        "no key": (httpx.post(f"{url}/v1/feedback", json=thumbs, timeout=60), 401, "unauthenticated"),
    }
    for what, (r, status, code) in refusals.items():
        assert (r.status_code, r.json()["error"]["code"]) == (status, code), (what, r.text)

    async def produce() -> None:
        async with Client(info["bootstrap"], topic_prefix=info["topic_prefix"]) as c:
            for _ in range(2):  # a producer's retry: the same feedback_id
                await c.send_feedback(Feedback(request_id=rid, metric="rating", value=0.25, feedback_id="fb-kafka-1",
                                               api_key=keys["acme"]))
            await c.send_feedback(Feedback(request_id=rid, metric="rating", value=1.0, feedback_id="fb-kafka-other",
                                           api_key=keys["other"]))

    asyncio.run(produce())
    rows = _rows_when(data_dir, "SELECT feedback_id, tenant_id, target, metric, value_float, value_text, episode_id "
                                f"FROM feedback FINAL WHERE request_id = '{rid}' OR episode_id = 'ep-fb-1' "
                                "ORDER BY metric", lambda r: len(r) >= 4)
    by_metric = {r["metric"]: r for r in rows}
    assert sorted(by_metric) == ["comment", "rating", "task_success", "thumbs_up"] and len(rows) == 4, rows
    assert {r["tenant_id"] for r in rows} == {"acme"}
    assert by_metric["thumbs_up"]["feedback_id"] == "fb-http-1" and by_metric["thumbs_up"]["value_float"] == 0.0
    assert by_metric["rating"]["feedback_id"] == "fb-kafka-1" and by_metric["rating"]["value_float"] == 0.25
    assert by_metric["task_success"]["target"] == "episode"
    text = by_metric["comment"]["value_text"]
    assert "jane.doe" not in text and "<EMAIL_ADDRESS_1>" in text and text.startswith("wrong answer")
    dead = _rows_when(data_dir, "SELECT error_class FROM dead_letters WHERE stage = 'feedback'", lambda r: len(r) >= 1)
    assert [r["error_class"] for r in dead] == ["forbidden"]  # the other tenant's Kafka feedback, nothing else
    req = _rows_when(data_dir, f"SELECT episode_id FROM requests FINAL WHERE request_id = '{rid}'", bool)
    assert req == [{"episode_id": "ep-fb-1"}]


def test_zz_generate_killed_mid_stream_shows_no_text_twice(door):
    """Last in the module: the supervisor restarts the killed worker, the request is redelivered,
    the new attempt streams from its first token and the caller sees a clean continuation."""
    import asyncio
    import os
    import signal
    import threading
    from pathlib import Path

    import psutil

    from pipeline.contracts.request import ChatBody, ChatMessage
    from pipeline.ingress.client import Client
    from pipeline.ingress.stream_follow import Ended
    from pipeline.security.sealing import Keyring

    info, keys, data_dir = door
    pid = info["pids"]["worker:generate"]
    engine = psutil.Process(pid).children(recursive=True)  # vLLM's engine core and its model worker
    assert engine, "the generate worker runs its engine in child processes"
    reaped: list[float] = []

    def alive(p: psutil.Process) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def watch_engine(t0: float) -> None:  # issue 22: the engine dies with its worker, within 10 s
        while time.monotonic() - t0 < 30:
            if not any(alive(p) for p in engine):
                reaped.append(time.monotonic() - t0)
                return
            time.sleep(0.1)

    async def run():
        async with Client(info["bootstrap"], topic_prefix=info["topic_prefix"],
                          doorbell_dir=Path(info["doorbell_dir"])) as cl:
            cl.delta_keyring = Keyring.local(data_dir / "secrets")  # generate seals deltas; this client may open them
            body = ChatBody(messages=[ChatMessage(role="user", content="Count from 1 to 100, separated by commas.")],
                            max_tokens=64, temperature=0)
            doc = cl.build(body=body, api_key=keys["acme"], timeout_s=400)
            events = []
            async for ev in cl.stream(doc, 400):
                events.append(ev)
                if len(events) == 4:
                    os.kill(pid, signal.SIGKILL)
                    threading.Thread(target=watch_engine, args=(time.monotonic(),), daemon=True).start()
            return doc.request_id, events

    rid, events = asyncio.run(run())
    assert reaped and reaped[0] <= 10, f"the killed worker's engine processes outlived it ({reaped})"
    end = events[-1]
    assert isinstance(end, Ended)
    shown = "".join(ev.text for ev in events[:-1])
    if end.ok:  # a clean continuation: exactly the answer, nothing twice
        assert shown == end.response.text
        attempts = [ev.attempt for ev in events[:-1] if ev.attempt]
        assert len(set(attempts)) == 2, "the answer was finished by a second attempt"
    else:  # or a clear error before the deadline
        assert end.error in ("stream_diverged", "deadline_exceeded"), end
    rows = _rows_when(data_dir, f"SELECT status FROM requests FINAL WHERE request_id = '{rid}'", lambda rows: bool(rows))
    assert len(rows) == 1
