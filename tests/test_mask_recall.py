"""mask on text its recognizers were not written against: the held-out set's recall per type and
false positives (reported; a floor guards regressions), the development set in full, and the
rules each recognizer adds (no infrastructure)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.stages.mask.eval import evaluate, read_sentences
from pipeline.stages.mask.pii import Masker, MaskPolicy
from tests.support.cli import last_json, llmpipe

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def masker() -> Masker:
    m = Masker(MaskPolicy())
    m.warm()
    return m


def test_the_held_out_set_is_big_bilingual_and_has_negatives():
    rows = read_sentences(DATA / "pii_unseen.jsonl")
    assert len(rows) >= 150
    assert sum(r.lang == "ko" for r in rows) >= 0.4 * len(rows) and sum(not r.pii for r in rows) >= 50
    kinds = {k for r in rows for k, _ in r.pii}
    assert kinds == {"PERSON", "LOCATION", "EMAIL_ADDRESS", "PHONE_NUMBER", "CREDIT_CARD", "IBAN_CODE", "US_SSN",
                     "KR_RRN", "IP_ADDRESS"}


def test_held_out_recall_and_false_positives_are_reported_above_a_floor(masker):
    """Measured once per change and reported in the notes (targets: recall >= 0.95 per type,
    false positives <= 5 %); never tuned on. The floor only catches a regression."""
    report = evaluate(masker, read_sentences(DATA / "pii_unseen.jsonl"))
    print("held-out recall:", {k: v["recall"] for k, v in report["recall"].items()},
          "false positives:", report["false_positive_rate"], "ms:", report["ms_per_request"])
    low = {k: v["recall"] for k, v in report["recall"].items() if v["recall"] < 0.85}
    assert not low, low
    assert report["false_positive_rate"] <= 0.05
    # the report names types and languages, never a value or a sentence
    assert all(set(m) == {"type", "lang"} for m in report["misses"])


def test_the_second_held_out_set_now_trains_and_is_held_at_a_floor(masker):
    """pii_unseen2.jsonl (written apart, 2026-12-03) judged one change (PERSON 0.70 -> 0.80, false
    positives 15 -> 17 %); its misses then shaped the chat cues, the speaker and sign-off rule and
    the glued-honorific check, so it is training data now: PERSON 0.85, false positives 15 %."""
    report = evaluate(masker, read_sentences(DATA / "pii_unseen2.jsonl"))
    print("set 2 (tuned):", {k: v["recall"] for k, v in report["recall"].items()}, report["false_positive_rate"])
    assert report["recall"]["PERSON"]["recall"] >= 0.84
    assert all(v["recall"] >= 0.93 for k, v in report["recall"].items() if k != "PERSON")
    assert report["false_positive_rate"] <= 0.16


def test_the_third_held_out_set_is_measured_and_held_at_a_floor(masker):
    """pii_unseen3.jsonl: 340 sentences written apart and committed (0991a78) before the change it
    judged, measured once before and once after it: PERSON 0.86 / 0.86, LOCATION 0.85 / 0.85, the
    other seven types 1.0, false positives 7.1 % / 6.0 %. The targets (0.95, 5 %) are missed; this
    catches a regression below what was measured. Never tuned on."""
    report = evaluate(masker, read_sentences(DATA / "pii_unseen3.jsonl"))
    print("held-out 3:", {k: v["recall"] for k, v in report["recall"].items()}, report["false_positive_rate"])
    assert report["recall"]["PERSON"]["recall"] >= 0.85 and report["recall"]["LOCATION"]["recall"] >= 0.85
    assert all(v["recall"] == 1.0 for k, v in report["recall"].items() if k not in ("PERSON", "LOCATION"))
    assert report["false_positive_rate"] <= 0.07


def test_the_training_set_is_held_where_it_was_tuned(masker):
    report = evaluate(masker, read_sentences(DATA / "pii_train2.jsonl"))
    assert all(v["recall"] >= 0.93 for v in report["recall"].values()), report["recall"]
    assert report["false_positive_rate"] <= 0.08


def test_the_development_set_is_masked_in_full_with_no_false_positive(masker):
    report = evaluate(masker, read_sentences(DATA / "pii_dev.jsonl"))
    assert report["recall_overall"] == 1.0, report["misses"]
    assert report["false_positives"] == 0, report["false_positive_types"]


@pytest.mark.parametrize("text,value", [
    ("SSN 123-45-6789 on file", "123-45-6789"),  # looks like a sample; still somebody's number
    ("my social security number is 219099999", "219099999"),
    ("외국인등록번호 950101-5234567 입니다", "950101-5234567"),  # foreigner: 7th digit 5-8
    ("주민번호 021103 4123457", "021103 4123457"),  # issued after 2020: no checksum to check
    ("reply to build-bot@ci.internal", "build-bot@ci.internal"),
    ("메일은 kim@corp.test로 주세요", "kim@corp.test"),
    ("amex 3714 496353 98431", "3714 496353 98431"),
    ("카드 4111111111111111로 결제", "4111111111111111"),  # a particle glued to the number
    ("접속 IP 172.16.254.1에서 차단", "172.16.254.1"),
    ("IBAN NL91 ABNA 0417 1643 00", "NL91 ABNA 0417 1643 00"),
    ("박서연이 주문했어요", "박서연"),
    ("송장은 최도윤한테 보내 주세요", "최도윤"),
    ("수령인: 남궁민수", "남궁민수"),
    ("Please ask Oliver Brennan to call", "Oliver Brennan"),
    ("tell anna kowalski the box is here", "anna kowalski"),
    ("Ship to 1420 Maple Grove Road, Portland, OR 97205", "1420 Maple Grove Road, Portland, OR 97205"),
    ("경기도 성남시 분당구 정자동 178-1 로 보내 주세요", "경기도 성남시 분당구 정자동 178-1"),
    ("Adresse: Hauptstraße 5, 10115 Berlin", "Hauptstraße 5, 10115 Berlin"),
    # 2026-12-03, tuned on pii_train2.jsonl
    ("민준아, 내일 보자", "민준"), ("ㅋㅋ 예린이 또 늦음", "예린"), ("박 팀장님이 휴가예요", "박"),
    ("마이클 스미스 씨가 주문한 상품", "마이클 스미스"), ("서버에 연태호 계정으로 접속", "연태호"),
    ("배송지: 부산광역시 해운대구 우동 1408-5 센텀파크 103동 2401호", "부산광역시 해운대구 우동 1408-5 센텀파크 103동 2401호"),
    ("Send it to Oudegracht 233bis, 3511 NS Utrecht please", "Oudegracht 233bis, 3511 NS Utrecht"),
    ("office: 42 boulevard Haussmann, 4e étage, 75009 Paris;", "42 boulevard Haussmann, 4e étage, 75009 Paris"),
    ("Can Elif sign for the parcel?", "Elif"), ("hi mohammed, the wifi changed", "mohammed"),
    ("Please ship it to Femke de Graaf today", "Femke de Graaf"), ("Mobile for Karthik Ramaswamy is", "Karthik Ramaswamy"),
    ("Typed it as 4716.3902.5518.8478 because", "4716.3902.5518.8478"), ("old Visa 4024 0071 8813 5", "4024 0071 8813 5"),
    # tuned on pii_unseen2.jsonl once it had judged a change
    ("Card: 5534 6216 0803 3483  Exp: 04/29  Name: BRENDAN KILBRIDE", "BRENDAN KILBRIDE"),
    ("[10:42] heike: can someone restart the build agent?", "heike"), ("can u resend the pdf? thx - nneka", "nneka"),
    ("lmk when ishita gets back", "ishita"), ("omg did u see what kavya posted", "kavya"),
])
def test_each_rule_masks_its_case(masker, text, value):
    masked = masker.mask([text]).texts[0]
    assert value not in masked and "<" in masked, masked


@pytest.mark.parametrize("text", [
    "Order ORD-2024-118273 is late", "Invoice INV 2025 004512", "예약번호 230415-0087 확인해 주세요",
    "order 1234567890 shipped", "배송지를 바꾸고 싶어요", "이번주 최저가로 샀어요", "담당 부서로 전달했습니다",
    "본인 인증을 했어요", "Will the May update grant access?", "Email support for firmware 3.11.207",
    "Lieferadresse: bitte ändern", "2 hours on the road", "zzqbroken zzqbroken",
    "부모님 성함을 적어 주세요", "원장 선생님 말씀이 오늘은 휴진이래요", "윤활유 교체 주기가 어떻게 되나요?",
    "고깃집 있을까요?", "I'm in Lisbon until Tuesday, then Porto for the weekend.", "order 2024.1101.5533.0001 shipped",
    "날씨가 추워져서 글씨 쓰기가 힘드네요.", "솜씨 좋은 이모님이 만든 반찬이에요", "tell me when will you come",
])
def test_identifiers_and_ordinary_words_are_left_alone(masker, text):
    assert masker.mask([text]).texts == [text]


def test_mask_eval_cli_prints_rates_and_no_value(tmp_path):
    r = llmpipe("mask-eval", "--file", str(DATA / "pii_dev.jsonl"), "--json", data_dir=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    report = last_json(r)
    assert report["recall_overall"] == 1.0 and report["negatives"] > 0 and report["ms_per_request"]["p95"] > 0
    values = [p["value"] for line in (DATA / "pii_dev.jsonl").read_text().splitlines() for p in json.loads(line)["pii"]]
    assert not [v for v in values if v in r.stdout + r.stderr]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "hello", "pii": [{"type": "PERSON", "value": "Zed"}]}\n')
    r = llmpipe("mask-eval", "--file", str(bad), data_dir=tmp_path)
    assert r.returncode != 0 and "bad.jsonl:1" in r.stderr and "not in the text" in r.stderr
