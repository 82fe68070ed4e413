"""The PII recognizers llmpipe adds to Presidio's regex set (no NER model needed).

Presidio's own pattern recognizers catch emails, phones, cards (Luhn), IPs and Korean RRNs;
without an NER model they miss names and addresses, so these project recognizers add:
Korean person names in honorific context (…님, …씨, … 고객님), English names after a title
(Mr./Ms./Dr. …), Korean road addresses, and Korean phone formats phonenumbers may skip.

Every repeat is bounded, and every pattern runs through `FailClosedPatterns`: a scan past
PATTERN_TIMEOUT_S raises `MaskTimeout` instead of being skipped (Presidio logs a timeout and carries
on, which would let the text pass unmasked).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import regex as re
import tldextract
from presidio_analyzer import Pattern, PatternRecognizer, RecognizerResult
from presidio_analyzer.nlp_engine import NlpArtifacts
from presidio_analyzer.predefined_recognizers import (
    CreditCardRecognizer,
    EmailRecognizer,
    IpRecognizer,
    KrRrnRecognizer,
)

RECOGNIZERS_REVISION = "kr-v2"

# per pattern scan of one window (the masker's windows are 2,000 chars; a scan takes a few ms at most).
# Presidio's default is 60 s (REGEX_TIMEOUT_SECONDS). The `regex` module's clock is the process's CPU
# time, so other threads' work counts too: keep ample headroom.
PATTERN_TIMEOUT_S = 0.2


class MaskFailed(RuntimeError):
    """PII detection did not complete, so the text must not go on (fail closed). Never retried:
    the same text would fail the same way. The message never holds the text."""

    error_class = "mask_failed"
    retryable = False


class MaskTimeout(MaskFailed):
    """A recognizer's regex ran past its timeout."""

# The most common Korean surnames (two-syllable ones first so they win the alternation).
_SURNAMES = (
    "남궁|황보|제갈|선우|독고|사공|서문|"
    "김|이|박|최|정|강|조|윤|장|임|한|오|서|신|권|황|안|송|류|유|전|홍|고|문|양|손|배|백|허|남|심|노|하|곽|"
    "성|차|주|우|구|민|진|지|엄|채|원|천|방|공|현|함|변|염|여|추|도|소|석|선|설|마|길|연|위|표|명|기|반|라|"
    "왕|금|옥|육|인|맹|제|모|탁|국|어|은|편|용|예|경|봉|사|부|가|복|태|목|형|피|두|감|음|빈|동|온|호|범|좌"
)
_TITLES = "고객|선생|과장|부장|대리|사장|팀장|교수|원장|회원|실장|차장|주임|이사|대표|간호사|기사"

KOREAN_NAME = Pattern(
    "korean name before an honorific",
    rf"(?<![가-힣])(?!(?:{_TITLES})\s?(?:님|씨))(?:{_SURNAMES})[가-힣]{{1,2}}"
    rf"(?=\s?(?:(?:{_TITLES})\s?)?(?:님|씨(?!앗|름)))",
    0.7,
)
# one lookbehind (ten alternative lookbehinds cost 40 ms per 32k chars); the dots are literal now
ENGLISH_TITLED_NAME = Pattern(
    "english name after a title",
    r"(?<=\b(?:(?:Mrs?|Ms|Miss|Dr)\.?|Prof\.)\s)[A-Z][a-z]{1,30}(?:\s[A-Z][a-z]{1,30}){0,2}\b",
    0.6,
)
# 시/도 (optional) + 시/군/구 (one or two) + 읍/면/동 (optional) + road name ending in 로/길 (optionally
# N번길) + building number. Each part is an atomic, bounded Hangul run ending in its suffix (never
# re-split), and a match starts only where a Hangul word does and a digit follows within 90 chars (a
# match has at most 72 before its first digit): the old unbounded, re-splittable runs backtracked
# cubically (800 × "시": 18 s).
_PROVINCES = "특별자치시|특별자치도|특별시|광역시|도"
KOREAN_ROAD_ADDRESS = Pattern(
    "korean road address",
    rf"(?<![가-힣])(?=[가-힣]\D{{0,90}}+\d)(?>[가-힣]{{2,10}}(?:{_PROVINCES})\s?)?(?>[가-힣]{{1,11}}[시군구]\s?){{1,2}}"
    r"(?>[가-힣]{1,11}[읍면동]\s?)?[가-힣0-9]{1,15}[로길](?:\s?\d{1,4}번?길)?\s?\d{1,5}(?:-\d{1,4})?",
    0.7,
)
KOREAN_PHONE = Pattern(
    "korean phone",
    r"(?<!\d)(?:\+82[-\s]?|0)(?:1[016789]|2|[3-6][1-5]|70)[-\s.]?\d{3,4}[-\s.]?\d{4}(?!\d)",
    0.6,
)


class _TimedRegex:
    """A compiled regex whose scans raise MaskTimeout past the timeout. Presidio catches
    TimeoutError around its pattern loop and skips the pattern; MaskTimeout is no TimeoutError."""

    def __init__(self, compiled: re.Pattern[str], name: str, timeout_s: float) -> None:
        self.compiled, self.name, self.timeout_s = compiled, name, timeout_s

    def finditer(self, text: str, *args: Any, **kwargs: Any) -> Iterator[re.Match[str]]:
        kwargs["timeout"] = self.timeout_s  # ours, not Presidio's 60 s
        try:
            # scan it all now: the clock runs from this call, and Presidio's work per match (e.g. the
            # email domain check, slow on first use) must not be charged to the pattern
            matches = list(self.compiled.finditer(text, *args, **kwargs))
        except TimeoutError as exc:
            raise MaskTimeout(f"pattern {self.name!r} timed out after {self.timeout_s} s") from exc
        return iter(matches)


class FailClosedPatterns(PatternRecognizer):
    """A PatternRecognizer (and a mixin for Presidio's own) whose patterns run with `timeout_s`, and
    a timeout raises.

    Relies on PatternRecognizer reusing `pattern.compiled_regex` while `compiled_with_flags` matches;
    tests/test_mask_redos.py checks a timeout still propagates through Presidio."""

    def __init__(self, *args: Any, timeout_s: float = PATTERN_TIMEOUT_S, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_s = timeout_s
        # own copies: predefined recognizers share their class-level Pattern objects
        self.patterns = [Pattern(p.name, p.regex, p.score) for p in self.patterns]

    def analyze(self, text: str, entities: list[str], nlp_artifacts: NlpArtifacts | None = None,
                regex_flags: int | None = None) -> list[RecognizerResult]:
        flags = regex_flags or self.global_regex_flags  # as PatternRecognizer picks them
        for p in self.patterns:
            if not isinstance(p.compiled_regex, _TimedRegex) or p.compiled_with_flags != flags:
                p.compiled_regex = _TimedRegex(re.compile(p.regex, flags=flags), p.name, self.timeout_s)
                p.compiled_with_flags = flags
        return super().analyze(text, entities, nlp_artifacts, regex_flags)


class OfflineEmailRecognizer(FailClosedPatterns, EmailRecognizer):
    """Presidio's email recognizer, validating domains against tldextract's bundled suffix list.

    The default extractor fetches the public suffix list over the network on first use."""

    _extract = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)

    def validate_result(self, pattern_text: str) -> bool:
        return self._extract(pattern_text).fqdn != ""


class FailClosedCreditCardRecognizer(FailClosedPatterns, CreditCardRecognizer):
    pass


class FailClosedIpRecognizer(FailClosedPatterns, IpRecognizer):
    pass


class FailClosedKrRrnRecognizer(FailClosedPatterns, KrRrnRecognizer):
    pass


def project_recognizers(language: str) -> list[PatternRecognizer]:
    return [
        FailClosedPatterns("PERSON", name="KoreanNameRecognizer", patterns=[KOREAN_NAME], supported_language=language),
        # case matters here: "Dr. Kim" is a name, "dr. said" is not
        FailClosedPatterns("PERSON", name="TitledNameRecognizer", patterns=[ENGLISH_TITLED_NAME],
                           supported_language=language, global_regex_flags=re.DOTALL | re.MULTILINE),
        FailClosedPatterns("LOCATION", name="KoreanRoadAddressRecognizer", patterns=[KOREAN_ROAD_ADDRESS],
                           supported_language=language),
        FailClosedPatterns("PHONE_NUMBER", name="KoreanPhoneRecognizer", patterns=[KOREAN_PHONE],
                           supported_language=language),
    ]
