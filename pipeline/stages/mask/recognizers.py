"""The recognizer set the masker runs: Presidio's pattern recognizers, fail-closed, plus the
project's own (names.py, addresses.py, ids.py) and, when its model is installed, spaCy's NER for
English names.

Presidio's defaults catch phones, cards (Luhn), IPs and IBANs (mod 97) but drop e-mails at
private top-level domains, SSNs that "look like samples" and Korean registration numbers issued
since 2020 (no checksum), and find no names or addresses without an NER model; the project
recognizers cover those. Every pattern runs through `FailClosedPatterns` (failclosed.py).
"""

from __future__ import annotations

import regex as re
from presidio_analyzer import EntityRecognizer, Pattern, PatternRecognizer

from pipeline.stages.mask import addresses, ids, names, names_ko
from pipeline.stages.mask.failclosed import (
    PATTERN_TIMEOUT_S,
    FailClosedPatterns,
    MaskFailed,
    MaskTimeout,
)

__all__ = ["PATTERN_TIMEOUT_S", "FailClosedPatterns", "MaskFailed", "MaskTimeout", "RECOGNIZERS_REVISION",
           "project_recognizers", "presidio_recognizers"]

RECOGNIZERS_REVISION = "kr-v5"

_CASED = re.DOTALL | re.MULTILINE  # Presidio's default adds IGNORECASE; names and streets need case


def presidio_recognizers(language: str, phone_regions: list[str]) -> list[EntityRecognizer]:
    """Presidio's own recognizers the masker keeps, some with the project's fixes (ids.py)."""
    return [
        ids.PhoneNumbersRecognizer(supported_language=language, supported_regions=tuple(phone_regions)),
        ids.AnyDomainEmailRecognizer(supported_language=language),
        ids.CardRecognizer(supported_language=language),
        ids.AsciiBoundaryIpRecognizer(supported_language=language),
        ids.FailClosedIbanRecognizer(supported_language=language),
    ]


def project_recognizers(language: str) -> list[PatternRecognizer]:
    """The project's pattern recognizers (each ReDoS-tested on max-size near-miss input)."""
    def rec(entity: str, name: str, patterns: list[Pattern], cased: bool = False) -> PatternRecognizer:
        return FailClosedPatterns(entity, name=name, patterns=patterns, supported_language=language,
                                  **({"global_regex_flags": _CASED} if cased else {}))

    return [
        rec("PERSON", "KoreanNameRecognizer", [names.KOREAN_HONORIFIC_NAME, names_ko.SURNAME_BEFORE_TITLE]),
        # case matters here: "Dr. Kim" is a name, "dr. said" is not
        rec("PERSON", "TitledNameRecognizer", [names.ENGLISH_TITLED_NAME], cased=True),
        rec("PERSON", "CuedNameRecognizer", [names.ENGLISH_CUED_NAME, names.CAPITALS_CUED_NAME], cased=True),
        rec("LOCATION", "KoreanRoadAddressRecognizer", [addresses.KOREAN_ROAD_ADDRESS, addresses.KOREAN_LOT_ADDRESS]),
        rec("LOCATION", "StreetAddressRecognizer", [p for p in addresses.PATTERNS if not p.name.startswith("korean")],
            cased=True),
        rec("PHONE_NUMBER", "KoreanPhoneRecognizer", [ids.KOREAN_PHONE]),
        rec("US_SSN", "UsSsnRecognizer", [ids.US_SSN, ids.US_SSN_CUED]),
        rec("KR_RRN", "KrRegistrationRecognizer", [ids.KR_REGISTRATION]),
    ]


def model_recognizers(language: str, spacy_model: str | None) -> list[EntityRecognizer]:
    """Recognizers backed by a model: Korean names by particle (Kiwi on demand), English names by NER."""
    out: list[EntityRecognizer] = [names.KoreanParticleNameRecognizer(supported_language=language),
                                   names_ko.KoreanGivenNameRecognizer(supported_language=language),
                                   names.GazetteerNameRecognizer(supported_language=language)]
    if spacy_model and names.SpacyPersonRecognizer.available(spacy_model):
        out.append(names.SpacyPersonRecognizer(spacy_model, supported_language=language))
    return out
