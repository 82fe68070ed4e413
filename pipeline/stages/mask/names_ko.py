"""Korean names that the surname rules (names.py) cannot see: a given name alone (민준아, 예린이
또, 태오랑), a surname alone before a title (박 팀장님, 김 대리), and foreign names written in Hangul
(마이클 스미스 씨, 다나카 히로시). Kiwi's proper-noun tag and the word after it decide: the
vocative (아/야), the nickname suffix 이, a kinship or job word, or a particle after a word that is
not a frequent Korean word (places like 부산 are frequent, and a place-name ending is excluded).
"""

from __future__ import annotations

from typing import Any

import regex as re
from presidio_analyzer import EntityRecognizer, Pattern, RecognizerResult
from presidio_analyzer.nlp_engine import NlpArtifacts

from pipeline.stages.mask.names import (
    _NOUN_SUFFIX,
    _SURNAMES_1,
    _TITLES,
    SURNAMES_1,
    SURNAMES_2,
    _ko_zipf,
    kiwi_tokens,
    name_lists,
)

# 박 팀장님, 김 대리, 윤 간호사님: a lone surname is a name before a title
SURNAME_BEFORE_TITLE = Pattern(
    "korean surname before a title",
    rf"(?<![가-힣])(?:{_SURNAMES_1})(?=\s(?:{_TITLES}|매니저|선배|쌤|작가|감독|변호사|의사|박사|기자|코치)님?(?![가-힣]{{2}}))",
    0.6,
)

# the word after a proper noun that makes it a person
_PERSON_AFTER = frozenset({"형", "누나", "언니", "오빠", "씨", "님", "선배", "후배", "쌤", "선생", "선생님", "학생", "사원",
                           "주임", "대리", "과장", "차장", "부장", "팀장", "실장", "교수", "원장", "간호사", "기사",
                           "고객", "군", "양", "매니저", "작가", "감독", "선수", "환자", "보호자", "드림"})
# titles and kin that Kiwi sometimes tags proper (원장 선생님, 부모님)
_NOT_NAMES = frozenset({*_TITLES.split("|"), "부모", "엄마", "아빠", "어머니", "아버지", "할머니", "할아버지", "선생",
                        "사장", "회장", "고객", "손님", "기사", "팀장", "대표", "원장"})
_UNKNOWN_IDS = 10
_LONG_RUN = re.compile(r"[가-힣]{24,}")  # Kiwi gives words outside its dictionary the first few morpheme ids (2, 3)
_PARTICLE_TAGS = frozenset({"JKS", "JKO", "JKG", "JKB", "JC", "JX", "JKC"})
_PLACE_END = tuple("역시구동도군읍면로길산강점관원")
_CLAUSE_END = ("가", "를", "은", "는", "서", "고", "요", "다", "면", "의", "에", "도")  # particles and verb endings
_FREQUENT = 3.5  # zipf: a proper noun this frequent as a word is a place or a thing more often than a person
# foreign names in Hangul: two to four words before an honorific (마이클 스미스 씨, 모하메드 알 파르시 님)
_HONORIFIC = r"(?:\s?(?:씨|님|고객님|교수님|선생님|박사님|대표님|기자님)(?![가-힣]{2}))"
_FOREIGN = re.compile(rf"(?<![가-힣])([가-힣]{{2,6}}(?:\s[가-힣]{{1,6}}){{1,3}}){_HONORIFIC}")
_CUED_FOREIGN = re.compile(r"(?:예약자|신청인|신청자|환자|보호자|근로자|수령인|이름|성명)\s?[:：]?\s"
                           r"([가-힣]{2,6}(?:\s[가-힣]{1,6}){1,3})(?=\s?[/(\n,]|$)")


class KoreanGivenNameRecognizer(EntityRecognizer):
    """Given names alone and foreign names in Hangul (the module docstring says how)."""

    def __init__(self, supported_language: str = "en") -> None:
        super().__init__(supported_entities=["PERSON"], name="KoreanGivenNameRecognizer",
                         supported_language=supported_language)

    def load(self) -> None:  # Presidio calls this at construction: no I/O there (see warm)
        pass

    def warm(self) -> None:
        _ko_zipf()
        self._tokens("준비")

    @staticmethod
    def _tokens(text: str) -> tuple[Any, ...]:
        """Kiwi's tokens; a Hangul run longer than any word is blanked first (offsets kept): Kiwi
        spends seconds on 32k characters of one run, and no name hides in one."""
        return kiwi_tokens(_LONG_RUN.sub(lambda m: " " * len(m.group()), text))

    def analyze(self, text: str, entities: list[str], nlp_artifacts: NlpArtifacts | None = None
                ) -> list[RecognizerResult]:
        if not re.search(r"[가-힣]", text):
            return []
        zipf = _ko_zipf()
        ko_given = name_lists()[2]
        out: list[RecognizerResult] = []
        tokens = self._tokens(text)
        for t in tokens:
            # a noun Kiwi's dictionary does not have (an unknown-word id), shaped surname + given name:
            # 연태호 계정, 허윤슬 환자, 변서준 / (윤활유 and 고깃집 are in the dictionary)
            if (t.tag in ("NNG", "NNP") and t.id < _UNKNOWN_IDS and re.fullmatch(r"[가-힣]{3,4}", t.form)
                    and ((len(t.form) == 3 and t.form[0] in SURNAMES_1) or t.form[:2] in SURNAMES_2)):
                out.append(RecognizerResult("PERSON", t.start, t.start + t.len, 0.6))
        for t, nxt in zip(tokens, [*tokens[1:], None]):
            if t.tag != "NNP" or not re.fullmatch(r"[가-힣]{2,3}", t.form) or nxt is None or t.form in _NOT_NAMES:
                continue
            if t.form[-1] in _NOUN_SUFFIX and zipf(t.form[:-1]) >= 2.0:
                continue  # 배송+지, 예약+자: a compound noun Kiwi calls proper
            if nxt.start != t.start + t.len and nxt.form not in _PERSON_AFTER:
                continue  # a particle is written on; a title stands apart
            common = zipf(t.form) >= _FREQUENT and t.form[-2:] not in ko_given
            if nxt.tag == "JKV" or (nxt.tag == "XSN" and nxt.form == "이"):
                person = True  # 민준아, 지성아, 예린이: a proper noun called to, or with the nickname 이
            elif nxt.form in _PERSON_AFTER:
                person = True  # 경수 형, 하진 사원
            else:
                person = nxt.tag in _PARTICLE_TAGS and not common and not t.form.endswith(_PLACE_END)
            if person:
                out.append(RecognizerResult("PERSON", t.start, t.start + t.len, 0.6))
        proper = {(t.start, t.start + t.len) for t in tokens if t.tag == "NNP"}
        for rx in (_FOREIGN, _CUED_FOREIGN):
            for m in rx.finditer(text):
                # foreign names are proper nouns or words Korean rarely uses (반, 알, 빈 between them may be common)
                spans = [(w.start(), w.end()) for w in re.finditer(r"[가-힣]+", m.group(1))]
                words = [(text[a + m.start(1):b + m.start(1)], (a + m.start(1), b + m.start(1))) for a, b in spans]
                glued = text[m.end(1):m.end(1) + 1] in ("씨", "님")  # 글씨, 마음씨, 솜씨: the honorific is part of a word
                if glued and zipf(words[-1][0] + text[m.end(1)]) >= 2.5:
                    continue
                if any(w.endswith(_CLAUSE_END) for w, _ in words[:-1]):
                    continue  # 날씨가 추워져서 ...: a particle or a verb ending inside it, a sentence not a name
                if all(zipf(w) < 2.5 or span in proper for w, span in words if len(w) >= 2) and len(words[0][0]) >= 2:
                    out.append(RecognizerResult("PERSON", m.start(1), m.end(1), 0.6))
        return out
