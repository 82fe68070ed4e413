"""PII never leaves mask: after the shipped PII set runs through a real stack, no raw PII string
is in any ClickHouse table, log line, metric or answer; after the held-out set runs through mask,
cache and postprocess, none is readable in the cache's write-backs or index files either (masking
misses some: those entries are sealed)."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from pathlib import Path

import httpx
import orjson
import pytest

from pipeline.ingress import Client
from tests.support.cli import last_json, llmpipe
from tests.support.kafka import read_topic
from tests.support.paths import DATA, FIXTURES
from tests.support.warehouse import rows_when, sql

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

ROWS = [json.loads(line) for line in (DATA / "pii_sentences.jsonl").read_text().splitlines() if line]


async def _run(data_dir: Path, config: str, rows: list[dict], until_stage: str) -> tuple[dict, list]:
    """Up with `config`, every row's text through the stack, until `until_stage` has evidence for all."""
    up = llmpipe("up", "--detach", "--config", str(FIXTURES / config), "--json", data_dir=data_dir)
    assert up.returncode == 0, up.stderr
    info = last_json(up)
    async with Client(info["bootstrap"], topic_prefix=info["topic_prefix"]) as client:
        docs = [client.build(r["text"], tenant_id="tenant-pii", timeout_s=120) for r in rows]
        answers = await asyncio.gather(*(client.request(d, 120) for d in docs))
    assert not [(i, a.error_class, a.reason) for i, a in enumerate(answers) if a.status != "ok"]
    # the sink writes in batches: the leak scans below must see every row's evidence, not a part
    await asyncio.to_thread(rows_when, data_dir,
                            f"SELECT (SELECT count() FROM decisions FINAL WHERE stage = '{until_stage}') AS decided, "
                            "(SELECT count() FROM requests FINAL) AS answered",
                            lambda r: r[0]["decided"] >= len(rows) and r[0]["answered"] >= len(rows), 120)
    return info, answers


def _haystacks(data_dir: Path, info: dict) -> dict[str, str]:
    """Every ClickHouse table, the logs and /metrics, as text."""
    out = {t: orjson.dumps(sql(data_dir, f"SELECT * FROM {t}")).decode() for t in
           ("decisions", "requests", "rollouts", "dead_letters", "weight_events")}
    out["logs"] = "".join(p.read_text(errors="replace") for p in (data_dir / "logs").glob("*.log"))
    out["metrics"] = httpx.get(f"{info['admin_url']}/metrics", timeout=10).text
    assert "llmpipe_records_processed_total" in out["metrics"]
    return out


async def test_no_raw_pii_anywhere_after_a_run(tmp_path):
    try:
        info, answers = await _run(tmp_path, "mask_answer.yaml", ROWS, "mask")
        values = sorted({p["value"] for r in ROWS for p in r["pii"]}, key=len, reverse=True)
        for a in answers:  # the answerer saw masked text only
            assert not [v for v in values if v.upper() in (a.text or "")], a.text
        masked = sql(tmp_path, "SELECT decision, count() AS n FROM decisions FINAL WHERE stage = 'mask' GROUP BY decision")
        assert masked == [{"decision": "masked", "n": len(ROWS)}]
        haystacks = _haystacks(tmp_path, info)
        leaks = {(where, v) for where, text in haystacks.items() for v in values if readable_in(v, text)}
        assert not leaks, sorted(leaks)[:10]
        # the evidence carries what an analyst needs: counts by type
        counts = sql(tmp_path, "SELECT sum(scores['entities.PERSON']) AS persons FROM decisions FINAL WHERE stage = 'mask'")
        from pipeline.stages.mask.config import MaskPolicy
        from pipeline.stages.mask.pii import Masker

        local = Masker(MaskPolicy())  # the same recognizers, here: the evidence counts what mask found
        found = sum(Counter(r.entity_type for r in local.analyze(row["text"]))["PERSON"] for row in ROWS)
        assert counts[0]["persons"] == found >= sum(p["type"] == "PERSON" for r in ROWS for p in r["pii"])
    finally:
        assert llmpipe("down", data_dir=tmp_path).returncode == 0


def readable_in(value: str, text: str) -> bool:
    """`value` appears in `text` as itself: not inside a longer Latin word ("tom" in "customer", or in
    base64 ciphertext, is not a readable name; it failed a clean clone once). Other scripts match as
    substrings (Korean particles follow a name without a space)."""
    if value not in text:  # the common case, at memchr speed: the haystacks are megabytes of index and logs
        return False
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(value)}(?![A-Za-z0-9])", text) is not None


def test_readable_in_tells_a_name_from_a_longer_word() -> None:
    assert readable_in("tom", "ok so tom is coming") and readable_in("tom", "Tom's and tom's")
    assert not readable_in("tom", "the customer's card") and not readable_in("tom", "q9Xtom3ZbA==")
    assert readable_in("김민준", "김민준님이 전화했어요") and readable_in("4111 1111", "card 4111 1111.")


UNSEEN = [json.loads(line) for line in (DATA / "pii_unseen.jsonl").read_text().splitlines() if line]


async def test_no_readable_pii_in_the_cache_write_backs_index_or_warehouse_after_the_held_out_set(tmp_path):
    try:
        info, _ = await _run(tmp_path, "mask_cache_writeback.yaml", UNSEEN, "postprocess")
        values = sorted({p["value"] for r in UNSEEN for p in r["pii"]}, key=len, reverse=True)
        # the write-backs: every unmasked sentence (negatives, and any whose PII the masker missed)
        control = await read_topic(info["bootstrap"], f"{info['topic_prefix']}control", 10**6, timeout=10, quiet_s=3)
        puts = [r.value for r in control if b'"sealed"' in r.value]
        negatives = sum(not r["pii"] for r in UNSEEN)  # some bypass (volatile words) or are over-masked
        assert len(puts) >= negatives // 2, (len(puts), negatives)
        haystacks = _haystacks(tmp_path, info)
        haystacks["control"] = b"".join(r.value for r in control).decode(errors="replace")
        index_files = [p for p in (tmp_path / "cache-index").rglob("*") if p.is_file()]
        assert index_files
        haystacks["index"] = b"".join(p.read_bytes() for p in index_files).decode(errors="replace")
        leaks = {(where, v) for where, text in haystacks.items() for v in values if readable_in(v, text)}
        assert not leaks, sorted((w, "len", len(v)) for w, v in leaks)[:10]  # where, never the value itself
    finally:
        assert llmpipe("down", data_dir=tmp_path).returncode == 0
