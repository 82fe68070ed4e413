"""Exploit attempts against a running stack (issue 16's findings), each refused.

One `llmpipe up` with the product's mask, cache and postprocess, authentication at its default,
and two test stages: `grow` (makes a document too large for its topic) and `fakegen` (fills the
generation section without a model, so postprocess validates and writes back real answers).
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from pathlib import Path

import httpx
import orjson
import pytest

from pipeline.registries.tenants import key_hash, new_api_key
from tests.support.cli import running

pytestmark = pytest.mark.integration

GROW_PAD = 9 << 20  # past the producer's 8 MiB record limit


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("security")
    keys = {"alice": new_api_key(), "bob": new_api_key()}
    config = {
        "tenants": [{"name": "acme", "api_keys": [{"key_sha256": key_hash(k), "principal": p}
                                                 for p, k in keys.items()]}],
        "stages": [{"name": "mask"}, {"name": "cache"},
                   {"name": "grow", "class": "tests.stages:Grow", "policy": {"pad_bytes": GROW_PAD}},
                   {"name": "fakegen", "class": "tests.stages:FakeGenerate"}, {"name": "postprocess"}],
    }  # no `auth`: the default must be secure
    with running(config, data_dir) as info:
        yield info, keys, data_dir


def chat(info, key: str | None, prompt: str, timeout: float = 120, **body) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(info["http_url"] + "/v1/chat/completions", headers=headers, timeout=timeout,
                      json={"messages": [{"role": "user", "content": prompt}], **body})


def sql(info, data_dir: Path, query: str) -> list[list]:
    token = (data_dir / "secrets" / "admin.token").read_text().strip()
    r = httpx.post(info["admin_url"] + "/sql", json={"query": query}, timeout=60,
                   headers={"authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    return r.json()["rows"]


def service_ms(info, data_dir: Path, request_id: str, stage: str) -> float:
    """The stage's service time for the request, from its evidence row (waits for the sink)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rows = sql(info, data_dir, f"SELECT service_ms FROM decisions FINAL WHERE request_id = '{request_id}' "
                                   f"AND stage = '{stage}'")
        if rows:
            return float(rows[0][0])
        time.sleep(0.5)
    raise AssertionError(f"no {stage} evidence for {request_id}")


def test_a_default_stack_refuses_keyless_callers_and_its_printed_dev_key_works(stack):
    info, _, data_dir = stack
    key = info.get("dev_api_key")
    assert key and key.startswith("lp-"), "llmpipe up shows the development key once"
    path = data_dir / "secrets" / "dev-api-key"
    assert path.read_text().strip() == key and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "dev_api_key" not in (data_dir / "stack.json").read_text()
    assert chat(info, None, "hello").status_code == 401
    assert chat(info, "lp-not-a-key", "hello").status_code == 401
    ok = chat(info, key, "hello")
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "answer for dev"
    health = httpx.get(info["http_url"] + "/healthz", timeout=10).json()
    assert health["auth_required"] is True and "warnings" not in health


def test_a_remote_schema_ref_never_makes_a_worker_connect(stack, listener):
    info, keys, _ = stack
    url, hits = listener
    for ref in (f"{url}/latest/meta-data/iam/", "file:///etc/hostname"):
        rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": ref}}}
        r = chat(info, keys["alice"], "Reply in JSON", response_format=rf)
        assert r.status_code == 422 and "not local" in r.json()["error"]["message"], r.text
    # straight onto the topic, past the door: refused where it is decoded, answered, dead-lettered
    from pipeline.ingress.client import Client

    async def direct():
        async with Client(info["bootstrap"], topic_prefix=info["topic_prefix"]) as client:
            doc = client.build("Reply in JSON", api_key=keys["alice"])
            raw = orjson.loads(doc.model_dump_json(by_alias=True))
            raw["body"]["response_format"] = {"type": "json_schema",
                                              "json_schema": {"name": "x", "schema": {"$ref": f"{url}/m"}}}
            fut = client._pending.setdefault(doc.request_id, asyncio.get_running_loop().create_future())
            await client.producer.send_and_wait(client.entry_topic, orjson.dumps(raw), key=doc.request_id.encode(),
                                                headers=[("request_id", doc.request_id.encode())])
            return await client.wait(doc.request_id, fut, 60)

    resp = asyncio.run(direct())
    assert resp.status == "error" and resp.error_class == "schema_invalid"
    time.sleep(1)
    assert hits == [], "a worker connected to the address a schema named"


def test_a_catastrophic_pattern_is_answered_within_a_second(stack):
    info, keys, data_dir = stack
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "^(a|aa)+$"}}}
    r = chat(info, keys["alice"], "backtrack, please", response_format=rf)
    assert r.json()["error"]["code"] == "schema_invalid" and "took longer than" in r.json()["error"]["message"]
    assert service_ms(info, data_dir, r.headers["x-request-id"], "postprocess") < 1000


@pytest.mark.parametrize("prompt", ["시" * 32_000, "광역시도" * 8_000, "서울특별시 강남구 " * 3_200])
def test_a_pathological_address_is_masked_within_a_second(stack, prompt):
    info, keys, data_dir = stack
    r = chat(info, keys["alice"], prompt)
    assert r.status_code == 200, r.text
    assert service_ms(info, data_dir, r.headers["x-request-id"], "mask") < 1000


def test_the_sql_endpoint_reads_no_files_and_writes_none(stack, tmp_path):
    info, _, data_dir = stack
    token = (data_dir / "secrets" / "admin.token").read_text().strip()
    assert stat.S_IMODE((data_dir / "secrets" / "admin.token").stat().st_mode) == 0o600
    target = tmp_path / "written.csv"
    attempts = ["SELECT * FROM file('/etc/hostname', 'LineAsString')",
                f"SELECT 1 INTO OUTFILE '{target}'",
                "SELECT * FROM url('http://127.0.0.1:1/x', 'CSV', 'a String')",
                "SELECT * FROM system.users", "SELECT 1 SETTINGS readonly = 0",
                "SELECT * FROM executable('id', 'TSV', 'a String')"]
    for q in attempts:
        no_token = httpx.post(info["admin_url"] + "/sql", json={"query": q}, timeout=30)
        assert no_token.status_code == 401
        r = httpx.post(info["admin_url"] + "/sql", json={"query": q}, timeout=30,
                       headers={"authorization": f"Bearer {token}"})
        assert r.status_code == 400, (q, r.text)
    assert not target.exists()
    assert sql(info, data_dir, "SELECT count() > 0 FROM decisions")[0][0] in (0, 1, True, False)


def test_a_request_too_large_for_its_topic_gets_one_answer_and_the_stack_goes_on(stack):
    info, keys, data_dir = stack
    big = b'{"messages": [{"role": "user", "content": "' + b"x" * (4 << 20) + b'"}]}'
    over = httpx.post(info["http_url"] + "/v1/chat/completions", content=big, timeout=60,
                      headers={"authorization": f"Bearer {keys['alice']}", "content-type": "application/json"})
    assert over.status_code == 413 and over.json()["error"]["code"] == "body_too_large"
    grown = chat(info, keys["alice"], "please grow")
    assert grown.status_code == 413 and grown.json()["error"]["code"] == "too_large", grown.text
    rid = grown.headers["x-request-id"]
    after = chat(info, keys["alice"], "still there?")
    assert after.status_code == 200
    rows = sql(info, data_dir, f"SELECT count() FROM requests FINAL WHERE request_id = '{rid}'")
    deadline = time.monotonic() + 30
    while rows[0][0] == 0 and time.monotonic() < deadline:
        time.sleep(0.5)
        rows = sql(info, data_dir, f"SELECT count() FROM requests FINAL WHERE request_id = '{rid}'")
    assert rows[0][0] == 1  # one terminal answer, recorded


def test_a_key_claiming_another_principals_acl_scope_reads_only_its_own(stack):
    info, keys, _ = stack
    q = "What are your opening hours on weekdays?"

    def ask(who: str, scope: str) -> tuple[str, str]:
        r = chat(info, keys[who], q, llmpipe={"context": {"acl_scope": scope}})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"], r.json()["llmpipe"]["cache"]

    assert ask("alice", "user") == ("answer for alice", "miss")
    deadline = time.monotonic() + 60
    while ask("alice", "user")[1] != "hit":  # the write-back travels on control to the cache worker
        assert time.monotonic() < deadline, "alice's answer was never cached"
        time.sleep(0.5)
    text, cache = ask("bob", "user:alice")
    assert (text, cache) == ("answer for bob", "miss"), "bob read alice's private entry"
    assert ask("alice", "user") == ("answer for alice", "hit"), "bob's write-back poisoned alice's entry"
    assert os.environ.get("LLMPIPE_API_KEY") is None  # nothing here leaned on an ambient key
