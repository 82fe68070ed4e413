"""Identifiers of a person Presidio's defaults miss, drop or over-match: e-mail addresses at any
top-level domain, phones (Korean formats; no order or invoice numbers), payment cards in every
common grouping, IPs next to Korean particles, US social-security numbers, and Korean resident and
foreigner registration numbers.

Policy: a number is dropped only when a checksum that really exists fails (cards: Luhn, IBAN:
mod 97, in Presidio's recognizers) or when the text names it as something else (an order number).
Shape rules that merely call a number "a sample" (123-45-6789, Presidio's SSN blocklist) or
checksums that no longer hold (Korean RRNs issued since October 2020 have none) never unmask
anything: a false positive costs a placeholder, a miss leaks."""

from __future__ import annotations

import regex as re
import tldextract
from presidio_analyzer import Pattern, RecognizerResult
from presidio_analyzer.nlp_engine import NlpArtifacts
from presidio_analyzer.predefined_recognizers import (
    CreditCardRecognizer,
    EmailRecognizer,
    IbanRecognizer,
    IpRecognizer,
    PhoneRecognizer,
)

from pipeline.stages.mask.failclosed import FailClosedPatterns

# Korean attaches particles to whatever precedes them ("192.168.0.1에서", "...1111로"); with Unicode
# word boundaries a Hangul letter counts as part of the number's word and hides it
ASCII_BOUNDARIES = re.DOTALL | re.MULTILINE | re.IGNORECASE | re.ASCII

KOREAN_PHONE = Pattern(
    "korean phone",
    r"(?<!\d)(?:\+82[-\s]?|0)(?:1[016789]|2|[3-6][1-5]|70)[-\s.]?\d{3,4}[-\s.]?\d{4}(?!\d)",
    0.6,
)
# what names a number as something other than a phone, right before it: "order 1234567890", "INV 2025 004512"
_ID_CUE = re.compile(
    r"(?i)(?:order|invoice|inv|ticket|ref|reference|po|tracking|sku|serial|case|booking|confirmation|reservation|"
    r"transaction|receipt|item|batch|lot|model|part|version|build|주문|예약|송장|운송장|사업자|접수|티켓|쿠폰|영수증|"
    r"거래|모델|제품|버전)\s?(?:번호|no\.?|number|id|#|num)?\s?[:#]?\s?$")

# 4-4-4-4(-1..3), Amex 4-6-5, Diners 4-6-4 with one consistent separator, or 15, 16 or 19 digits in a
# row; issuer digits 2-6 (Mastercard's 2-series included) and 9 (Korean domestic cards). Luhn decides.
CARD = Pattern(
    "payment card",
    r"(?<![\d-])(?:(?:[2-69]\d{3})([- .])\d{4}\1\d{4}\1\d{4}(?:\1\d{1,3})?|3[47]\d{2}([- ])\d{6}\2\d{5}"
    r"|3[0689]\d{2}([- ])\d{6}\3\d{4}|[2-69]\d{14,15}|[2-69]\d{18}"
    # 13-digit Visa 4-4-4-1, 14-digit Diners 2-4-4-4, and both unspaced
    r"|4\d{3}([- .])\d{4}\4\d{4}\4\d|3[0689]([- ])\d{4}\5\d{4}\5\d{4}|4\d{12}|3[0689]\d{12})(?![\d-])",
    0.5,
)
# 3-2-4 with one consistent separator; not inside a longer dashed or dotted number
US_SSN = Pattern("us ssn 3-2-4", r"(?<![\d\-.])\d{3}([-\s.])\d{2}\1\d{4}(?![\d\-])", 0.6)
# nine digits in a row only right after a cue that names an SSN
US_SSN_CUED = Pattern(
    "us ssn after a cue",
    r"(?i)(?<=\b(?:ssn|ss#|social\s?security(?:\s(?:number|no\.?|num|#))?|tin)\W{0,3}(?:(?:is|was|=)\s)?\W{0,2})"
    r"\d{9}(?!\d)",
    0.6,
)
# YYMMDD, a separator or none, then 7 digits whose first is 1-4 (citizens) or 5-8 (foreigners)
KR_REGISTRATION = Pattern(
    "korean resident or foreigner registration number",
    r"(?<![\d-])\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])\s?[-–—]?\s?[1-8]\d{6}(?![\d-])",
    0.6,
)


class AnyDomainEmailRecognizer(FailClosedPatterns, EmailRecognizer):
    """Presidio's e-mail pattern, kept whatever the domain: reserved and private top-level domains
    (.test, .local, .internal, a company's own) are addresses too, and the suffix list would drop them.
    tldextract uses only its bundled list here: the default extractor fetches one over the network."""

    _extract = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)

    def validate_result(self, pattern_text: str) -> bool:
        host = pattern_text.rpartition("@")[2]
        # a dotted host ending in letters: name@host.tld, whatever the tld
        return self._extract(pattern_text).fqdn != "" or host.rpartition(".")[2].isalpha()


class FailClosedIbanRecognizer(FailClosedPatterns, IbanRecognizer):
    """Presidio's IBAN recognizer (country formats and the mod-97 check), fail-closed."""


class CardRecognizer(FailClosedPatterns, CreditCardRecognizer):
    """Payment cards in the groupings people write (Presidio's pattern misses Amex 4-6-5, the
    2-series and 9-prefixed cards, and cards glued to a Korean particle), Luhn-checked by Presidio."""

    def __init__(self, supported_language: str) -> None:
        super().__init__(patterns=[CARD], supported_language=supported_language,
                         replacement_pairs=[("-", ""), (" ", ""), (".", "")])  # 4716.3902.5518.8478 too
        self.global_regex_flags = ASCII_BOUNDARIES


class AsciiBoundaryIpRecognizer(FailClosedPatterns, IpRecognizer):
    """Presidio's IPv4/IPv6 patterns with ASCII word boundaries (see ASCII_BOUNDARIES)."""

    def __init__(self, supported_language: str) -> None:
        super().__init__(supported_language=supported_language)
        self.global_regex_flags = ASCII_BOUNDARIES


class PhoneNumbersRecognizer(PhoneRecognizer):
    """Presidio's phone recognizer (libphonenumber, per region), minus matches that are part of an
    identifier: glued to letters ("ORD-2024-118273") or named as an order, invoice or booking
    number right before them. Korean mobile formats are matched separately and never dropped."""

    # libphonenumber walks every digit group once per region (9 regions: 0.9 s for a 32k prompt of
    # house numbers), so it is run only on snippets around runs that hold enough digits to dial
    _DIGIT_RUN = re.compile(r"\+?[(\d][\d\s().\-/]*\d")
    MIN_DIGITS = 5
    MARGIN = 16  # characters each side: the matcher reads the neighbours ("ext. 12", a glued letter)

    def _snippets(self, text: str) -> list[tuple[int, int]]:
        spans: list[tuple[int, int]] = []
        for m in self._DIGIT_RUN.finditer(text):
            if sum(ch.isdigit() for ch in m.group()) < self.MIN_DIGITS:
                continue
            lo, hi = max(0, m.start() - self.MARGIN), min(len(text), m.end() + self.MARGIN)
            if spans and lo <= spans[-1][1]:
                spans[-1] = (spans[-1][0], hi)
            else:
                spans.append((lo, hi))
        return spans

    def analyze(self, text: str, entities: list[str], nlp_artifacts: NlpArtifacts | None = None
                ) -> list[RecognizerResult]:
        found: list[RecognizerResult] = []
        for lo, hi in self._snippets(text):
            for r in super().analyze(text[lo:hi], entities, nlp_artifacts):
                r.start, r.end = r.start + lo, r.end + lo
                found.append(r)
        kept = []
        for r in found:
            glued = r.start > 0 and (text[r.start - 1].isalpha() or (
                text[r.start - 1] in "-_/" and r.start > 1 and text[r.start - 2].isalnum()))
            if not glued and not _ID_CUE.search(text[max(0, r.start - 24):r.start]):
                kept.append(r)
        return kept
