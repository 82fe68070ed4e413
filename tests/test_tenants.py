"""The tenant registry and authentication at the front of the pipeline.

Unit part: hashed keys, revocation, limit updates. Integration part: `llmpipe tenants add` and
`revoke-key` publish on `control` while a mask worker runs; keyed requests are authenticated and
stripped of their key; unknown, revoked and missing keys and oversized prompts are rejected before
any later stage runs."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from pipeline.app.assemble import topology_for
from pipeline.app.launch import stage_worker
from pipeline.config.tenants import TenantSpec
from pipeline.contracts import Evidence
from pipeline.contracts.control import ApiKeyIssued, ApiKeyRevoked, TenantUpsert
from pipeline.contracts.request import ChatBody, ChatMessage
from pipeline.ingress import Client
from pipeline.registries.tenants import TenantRegistry, key_hash, new_api_key
from pipeline.runtime.codec import decode
from pipeline.runtime.topics import TopicNames
from pipeline.stages.mask.auth import authenticate
from tests.support.kafka import create_topics, read_topic, settings_for
from tests.support.paths import ROOT


def test_keys_are_kept_hashed_and_revocation_wins():
    key = new_api_key()
    reg = TenantRegistry([TenantSpec(name="acme", api_keys=[{"key_sha256": key_hash(key), "roles": ["agent"]}])])
    assert key not in repr(reg.keys) and key.startswith("lp-") and len(key) > 40
    caller = reg.authenticate(key)
    assert caller is not None and caller.tenant == "acme" and caller.roles == ("agent",)
    assert caller.key_id == key_hash(key)[:12]
    assert reg.authenticate(new_api_key()) is None and reg.why_refused(new_api_key()) == "unknown_key"
    assert reg.apply(ApiKeyRevoked(key_sha256=key_hash(key)))
    assert reg.authenticate(key) is None and reg.why_refused(key) == "revoked_key"
    other = new_api_key()
    reg.apply(ApiKeyIssued(tenant="globex", key_sha256=key_hash(other), principal="bot"))
    assert reg.authenticate(other).tenant == "globex"


def test_limit_updates_merge_and_invalid_ones_change_nothing():
    reg = TenantRegistry()
    assert reg.apply(TenantUpsert(tenant="acme", limits={"rpm": 120, "concurrency": 4}))
    assert reg.apply(TenantUpsert(tenant="acme", limits={"rpm": 60}))
    lim = reg.limits_for("acme")
    assert lim.rpm == 60 and lim.concurrency == 4 and lim.tpm == reg.defaults.tpm  # a new tenant starts from the defaults
    assert not reg.apply(TenantUpsert(tenant="acme", limits={"rpm": -1}))
    assert reg.limits_for("acme").rpm == 60


def test_authenticate_strips_the_key_and_names_the_caller():
    from pipeline.contracts import RequestDoc

    key = new_api_key()
    reg = TenantRegistry([TenantSpec(name="acme", api_keys=[{"key_sha256": key_hash(key), "principal": "svc"}])])
    doc = RequestDoc(request_id="r", api_key=key, body=ChatBody(messages=[ChatMessage(role="user", content="hi")]))
    authed, refused, _ = authenticate(doc, reg, required=True)
    assert refused is None and authed.api_key is None and authed.tenant_id == "acme" and authed.principal == "svc"
    _, refused, why = authenticate(doc.model_copy(update={"tenant_id": "globex"}), reg, required=True)
    assert refused == "unauthenticated" and why == "the key belongs to another tenant"
    bare = doc.model_copy(update={"api_key": None, "tenant_id": "acme"})
    assert authenticate(bare, reg, required=True)[1] == "unauthenticated"
    assert authenticate(bare, reg, required=False)[1] is None
    # auth off and no tenant named: the anonymous tenant, metered by the defaults, never "no limits"
    anon, refused, _ = authenticate(bare.model_copy(update={"tenant_id": None}), reg, required=False)
    assert refused is None and anon.tenant_id == "anonymous"
    assert reg.limits_for("anonymous") == reg.limits_for("nobody-configured") == reg.defaults
    assert reg.defaults.rpm is not None and reg.defaults.concurrency is not None


def cli(*args: str, prefix: str, bootstrap: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args, "--bootstrap", bootstrap, "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, env={**os.environ, "LLMPIPE_TOPIC_PREFIX": prefix})


@pytest.mark.integration
@pytest.mark.asyncio(loop_scope="session")
async def test_keys_added_and_revoked_while_running(broker, prefix, tmp_path):
    import orjson

    s = settings_for(tmp_path, prefix, broker.bootstrap,
                     [{"name": "mask"}, {"name": "answer", "class": "tests.stages:Answer"}], auth={"required": True})
    await create_topics(s)
    names = TopicNames(prefix)
    added = cli("tenants", "add", "acme", "--rpm", "100", "--principal", "svc", prefix=prefix, bootstrap=broker.bootstrap)
    assert added.returncode == 0, added.stderr
    info = orjson.loads(added.stdout.strip().splitlines()[-1])
    key = info["api_key"]
    assert info["tenant"] == "acme" and info["key_id"] == key_hash(key)[:12]
    workers = [stage_worker(s, topology_for(s), n, broker.bootstrap) for n in ("mask", "answer")]
    for w in workers:
        await w.start()  # mask replays control before its first record: the key is known
    try:
        async with asyncio.timeout(240), Client(broker.bootstrap, topic_prefix=prefix) as client:
            def ask(text: str = "hello", **kw):
                return client.build(body=ChatBody(messages=[ChatMessage(role="user", content=text)]), timeout_s=60, **kw)

            ok_doc = ask(api_key=key)
            ok = await client.request(ok_doc, 60)
            assert ok.status == "ok" and ok.tenant_id == "acme" and ok.answered_by == "answer", ok
            unknown = await client.request(ask(api_key=new_api_key()), 60)
            missing = await client.request(ask(tenant_id="acme"), 60)
            huge = await client.request(ask("x" * 40_000, api_key=key), 60)
            # in a thread: a blocking call here would stall the workers' heartbeats on this event loop
            revoked = await asyncio.to_thread(cli, "tenants", "revoke-key", "--sha256", key_hash(key), prefix=prefix,
                                              bootstrap=broker.bootstrap)
            assert revoked.returncode == 0, revoked.stderr
            for _ in range(100):
                after = await client.request(ask(api_key=key), 60)
                if after.status == "rejected":
                    break
                await asyncio.sleep(0.2)
            # what a producer sees from `llmpipe load` with the revoked key: rejections by class
            traffic = tmp_path / "t.jsonl"
            traffic.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n' * 5)
            loaded = await asyncio.to_thread(cli, "load", "--file", str(traffic), "--api-key", key, prefix=prefix,
                                             bootstrap=broker.bootstrap)
            assert loaded.returncode == 0, loaded.stderr
            summary = orjson.loads(loaded.stdout.strip().splitlines()[-1])
            assert summary["by_status"] == {"rejected": 5} and summary["by_error_class"] == {"unauthenticated": 5}
    finally:
        for w in reversed(workers):
            await w.stop()
    for r in (unknown, missing, after):
        assert r.status == "rejected" and r.error_class == "unauthenticated" and r.answered_by == "mask", r
    assert unknown.reason == after.reason == "unknown or revoked API key", "the caller is not told which"
    assert huge.status == "rejected" and huge.error_class == "too_large" and "40000 characters" in huge.reason
    ev = [decode(r.value, Evidence) for r in await read_topic(broker.bootstrap, names.evidence, 10**9, timeout=3)]
    rejected_ids = {unknown.request_id, missing.request_id, huge.request_id, after.request_id}
    assert not [e for e in ev if e.stage == "answer" and e.request_id in rejected_ids], "nothing downstream ran"
    reasons = {e.reason for e in ev if e.stage == "mask" and e.decision == "rejected"}
    assert {"unauthenticated: unknown_key", "unauthenticated: revoked_key", "unauthenticated: an API key is required"} \
        <= reasons, reasons
    dump = b""
    for t in (names.evidence, names.responses, names.stage_input("answer")):
        recs = await read_topic(broker.bootstrap, t, 10**9, timeout=2)
        assert recs, f"{t} holds records for the leak check to search"
        dump += b"".join(r.value for r in recs)
    assert key.encode() not in dump, "the key never travels past mask"
