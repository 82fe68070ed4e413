"""mask: recall on the shipped PII set, placeholders, the sealed restore mapping (no infrastructure)."""

from __future__ import annotations

import json
import os
import stat
from collections import Counter
from pathlib import Path

import pytest

from pipeline.config.settings import Settings, StageSpec
from pipeline.contracts import RequestDoc
from pipeline.runtime.stage import StageContext
from pipeline.security.sealing import (
    Keyring,
    RestoreError,
    keyring_for,
    open_sealed,
    seal,
    unmask,
)
from pipeline.stages.mask.config import MaskPolicy
from pipeline.stages.mask.pii import Masker
from pipeline.stages.mask.stage import MaskStage, mask_document

DATA = Path(__file__).parent / "data" / "pii_sentences.jsonl"
ROWS = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def masker() -> Masker:
    return Masker(MaskPolicy())


def test_the_shipped_set_is_big_enough_and_bilingual():
    assert len(ROWS) >= 50
    assert any("@" in r["text"] and r["text"].isascii() for r in ROWS)
    assert sum(any("\uac00" <= ch <= "\ud7a3" for ch in r["text"]) for r in ROWS) >= 25


def test_every_pii_string_is_gone_and_recall_is_reported(masker):
    total, caught, missed = Counter(), Counter(), []
    for row in ROWS:
        masked = masker.mask([row["text"]]).texts[0]
        for pii in row["pii"]:
            total[pii["type"]] += 1
            if pii["value"] in masked:
                missed.append((pii["type"], row["text"]))
            else:
                caught[pii["type"]] += 1
    recall = {t: caught[t] / total[t] for t in sorted(total)}
    print("mask recall by entity type:", recall)
    assert set(total) == {"EMAIL_ADDRESS", "PHONE_NUMBER", "CREDIT_CARD", "IP_ADDRESS", "PERSON", "KR_RRN", "LOCATION"}
    assert not missed, missed


@pytest.mark.parametrize("text", [
    "How do I reset my password?", "이번 주 일정 알려주세요", "안녕하세요 고객님, 무엇을 도와드릴까요?",
    "선생님 감사합니다", "The order 12345 shipped on 2026-11-02", "Version 2.14 of the app crashes at 10:30",
])
def test_plain_text_is_left_alone(masker, text):
    result = masker.mask([text])
    assert result.texts == [text] and result.total == 0


@pytest.mark.parametrize("text,masked", [
    ("서울특별시 강남구 테헤란로 123", "<LOCATION_1>"),
    ("부산광역시 해운대구 해운대로 570번길 12", "<LOCATION_1>"),
    ("배송지: 경기도 양구군 양구읍 금강산로 12-3 (3층)", "배송지: <LOCATION_1>"),  # the floor goes with it
    ("제주특별자치도 제주시 1100로 3000", "<LOCATION_1>"),
    ("서울시강남구테헤란로123", "<LOCATION_1>"),
    ("김철수님 안녕하세요", "<PERSON_1>님 안녕하세요"),
    ("010-1234-5678", "<PHONE_NUMBER_1>"),
    ("Dr. Jane Smith", "Dr. <PERSON_1>"),
    ("Dry Smith", "Dry Smith"),  # a title's dot is literal
])
def test_project_recognizers_find_addresses_names_and_phones(masker, text, masked):
    assert masker.mask([text]).texts == [masked]


def test_one_value_one_placeholder_across_messages(masker):
    r = masker.mask(["Mail john@example.com now", "Did john@example.com answer? Try ann@example.com"])
    assert r.texts == ["Mail <EMAIL_ADDRESS_1> now", "Did <EMAIL_ADDRESS_1> answer? Try <EMAIL_ADDRESS_2>"]
    assert r.counts == Counter({"EMAIL_ADDRESS": 2})


def _doc(text: str, rid: str = "req-1") -> RequestDoc:
    return RequestDoc(request_id=rid, tenant_id="t1", body={"messages": [{"role": "user", "content": text}]})


def test_the_sealed_mapping_restores_exactly_and_only_for_its_request(masker, tmp_path):
    ring = Keyring.local(tmp_path)
    text = "홍길동님, 010-1234-5678 또는 hong@example.com 으로 연락주세요"
    masked, result = mask_document(_doc(text), masker, ring)
    sec = masked.masking
    assert sec is not None and sec.decision == "masked"
    assert sec.entity_counts == {"PERSON": 1, "PHONE_NUMBER": 1, "EMAIL_ADDRESS": 1}
    assert "010-1234-5678" not in masked.model_dump_json() and "hong@" not in masked.model_dump_json()
    mapping = open_sealed(sec.restore_token, "req-1", ring)
    assert unmask(masked.body.messages[0].content, mapping) == text
    with pytest.raises(RestoreError):
        open_sealed(sec.restore_token, "req-2", ring)  # bound to its request
    tampered = sec.restore_token[:-4] + ("AAAA" if not sec.restore_token.endswith("AAAA") else "BBBB")
    with pytest.raises(RestoreError):
        open_sealed(tampered, "req-1", ring)
    with pytest.raises(RestoreError):
        open_sealed(sec.restore_token, "req-1", Keyring.local(tmp_path / "other"))


def test_unmask_handles_placeholder_prefixes():
    mapping = {f"<PERSON_{i}>": f"name{i}" for i in range(1, 12)}
    assert unmask("<PERSON_1> and <PERSON_11>", mapping) == "name1 and name11"


def test_keys_from_settings_or_a_private_local_file(tmp_path):
    import base64

    key = base64.b64encode(os.urandom(32)).decode()
    s = Settings(data_dir=tmp_path, secrets={"mask_keys": {"k9": key}})
    ring = keyring_for(s)
    assert ring.active == "k9" and seal({"a": "b"}, "r", ring).startswith("v1.k9.")
    assert key not in repr(s), "secrets never print"
    local = keyring_for(Settings(data_dir=tmp_path))
    path = tmp_path / "secrets" / "mask-local.key"
    assert local.active == "local" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert keyring_for(Settings(data_dir=tmp_path)).keys == local.keys  # stable across processes
    with pytest.raises(RestoreError):
        Keyring.from_b64({"short": base64.b64encode(b"x" * 8).decode()}, "short")


@pytest.mark.asyncio
async def test_stage_evidence_counts_types_and_never_text(tmp_path):
    s = Settings(data_dir=tmp_path, stages=[StageSpec(name="mask", policy={"version": "mask-test"})],
                 auth={"required": False})  # a trusted producer's request: no key
    stage = MaskStage(StageContext(spec=s.stage("mask"), settings=s, runtime=s.runtime))
    await stage.start()
    [out] = await stage.process_batch([_doc("Dr. Alice Wong, alice@wong.org, 4111 1111 1111 1111")])
    ev = out.evidence[0]
    assert ev.decision == "masked" and ev.policy_version == "mask-test"
    assert ev.scores == {"entities.CREDIT_CARD": 1.0, "entities.EMAIL_ADDRESS": 1.0, "entities.PERSON": 1.0}
    dumped = ev.model_dump_json()
    assert "Alice" not in dumped and "wong.org" not in dumped and "4111" not in dumped
    assert ev.revisions["mask_engine"].startswith("presidio-")


def test_tenant_overrides_change_the_policy(tmp_path):
    from pipeline.stages.mask.config import MaskStagePolicy

    p = MaskStagePolicy(tenants={"t-ip-ok": {"entities": ["EMAIL_ADDRESS"]}})
    assert "IP_ADDRESS" not in p.for_tenant("t-ip-ok").entities
    assert "IP_ADDRESS" in p.for_tenant("someone-else").entities
