"""mask on labelled sentences: the held-out sets' recall per type and false positives, and the
development set, held at floors (one masker for the module); the rules each recognizer adds; and
`llmpipe mask-eval`'s contract (rates, no value printed, a bad file refused) on a few sentences.

The held-out sets were written apart and never tuned on; the targets there (recall >= 0.95 per
type, false positives <= 5 %) are missed for names and addresses, so the floors sit at what was
measured and catch a regression only. Every set with its full report (per type and language,
tuned and held out side by side, misses by type) is bench/mask_eval.py's (bench/README.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pipeline.evaluation.mask import evaluate, read_sentences
from pipeline.stages.mask.config import MaskPolicy
from pipeline.stages.mask.pii import Masker
from tests.support.cli import llmpipe_in_process

DATA = Path(__file__).parent / "data"
TYPES = {"PERSON", "LOCATION", "EMAIL_ADDRESS", "PHONE_NUMBER", "CREDIT_CARD", "IBAN_CODE", "US_SSN", "KR_RRN",
         "IP_ADDRESS"}


@dataclass(frozen=True)
class Floor:
    recall: float  # every type not named in `types`
    max_false_positive_rate: float
    measured: str  # what was measured when the floor was set (2026-12-04)
    types: dict[str, float] = field(default_factory=dict)


FLOORS = {
    # held out, written apart and committed (0991a78) before the change it judged; never tuned on
    "pii_unseen3.jsonl": Floor(1.0, 0.07, "PERSON 0.86, LOCATION 0.85, others 1.0, false positives 5/84 (6.0 %)",
                               {"PERSON": 0.85, "LOCATION": 0.85}),
    # the first held-out set, never tuned on, measured several times since
    "pii_unseen.jsonl": Floor(0.85, 0.05, "PERSON 0.92, US_SSN 0.92, LOCATION 0.98, others 1.0, false positives 0/72"),
    # the development set of the 2026-12-03 recognizers (tuned): masked in full
    "pii_dev.jsonl": Floor(1.0, 0.0, "every type 1.0, false positives 0/27"),
}


@pytest.fixture(scope="module")
def masker() -> Masker:
    m = Masker(MaskPolicy())
    m.warm()
    return m


def test_the_held_out_sets_are_big_bilingual_and_have_negatives():
    for name in ("pii_unseen.jsonl", "pii_unseen3.jsonl"):
        rows = read_sentences(DATA / name)
        assert len(rows) >= 150, name
        assert sum(r.lang == "ko" for r in rows) >= 0.4 * len(rows) and sum(not r.pii for r in rows) >= 50, name
        assert {k for r in rows for k, _ in r.pii} == TYPES, name


@pytest.mark.parametrize("name", list(FLOORS))
def test_recall_per_type_and_false_positives_stay_at_their_floors(name, masker):
    floor = FLOORS[name]
    rows = read_sentences(DATA / name)
    report = evaluate(masker, rows)
    recall = {k: v["recall"] for k, v in report["recall"].items()}
    print(name, "recall:", recall, "false positives:", report["false_positives"], "of", report["negatives"],
          "ms:", report["ms_per_request"], "floor:", floor)
    assert report["sentences"] == len(rows) and set(recall) == {k for r in rows for k, _ in r.pii}
    low = {k: v for k, v in recall.items() if v < floor.types.get(k, floor.recall)}
    assert not low, (low, report["misses"])
    assert report["false_positive_rate"] <= floor.max_false_positive_rate, report["false_positive_types"]
    # the report names types and languages, never a value or a sentence
    assert all(set(m) == {"type", "lang"} for m in report["misses"])


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
    # a few development sentences: the first of each type, and three negatives
    lines = [json.loads(line) for line in (DATA / "pii_dev.jsonl").read_text().splitlines() if line.strip()]
    firsts = {p["type"]: row for row in reversed(lines) for p in row["pii"]}
    few = [*{id(r): r for r in firsts.values()}.values(), *[r for r in lines if not r["pii"]][:3]]
    sentences = tmp_path / "few.jsonl"
    sentences.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in few))
    r = llmpipe_in_process("mask-eval", "--file", str(sentences), "--json", data_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(report["recall"]) == {p["type"] for row in few for p in row["pii"]} and len(report["recall"]) >= 5
    assert report["recall_overall"] == 1.0 and report["negatives"] == 3 and report["false_positives"] == 0
    assert report["sentences"] == len(few) and report["ms_per_request"]["p95"] > 0
    assert report["engine_revision"].startswith("presidio-")
    values = [p["value"] for row in few for p in row["pii"]]
    assert not [v for v in values if v in r.stdout + r.stderr]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "hello", "pii": [{"type": "PERSON", "value": "Zed"}]}\n')
    r = llmpipe_in_process("mask-eval", "--file", str(bad), data_dir=tmp_path)
    assert r.returncode == 1 and "bad.jsonl:1" in r.stderr and "not in the text" in r.stderr, r.stderr
