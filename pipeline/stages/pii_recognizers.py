"""The PII recognizers llmpipe adds to Presidio's regex set (no NER model needed).

Presidio's own pattern recognizers catch emails, phones, cards (Luhn), IPs and Korean RRNs;
without an NER model they miss names and addresses, so these project recognizers add:
Korean person names in honorific context (…님, …씨, … 고객님), English names after a title
(Mr./Ms./Dr. …), Korean road addresses, and Korean phone formats phonenumbers may skip.
"""

from __future__ import annotations

import regex as re
import tldextract
from presidio_analyzer import Pattern, PatternRecognizer
from presidio_analyzer.predefined_recognizers import EmailRecognizer

RECOGNIZERS_REVISION = "kr-v1"

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
ENGLISH_TITLED_NAME = Pattern(
    "english name after a title",
    "(?:" + "|".join(rf"(?<=\b{t}\s)" for t in ("Mr.", "Mr", "Mrs.", "Mrs", "Ms.", "Ms", "Miss", "Dr.", "Dr", "Prof."))
    + r")[A-Z][a-z]+(?:\s[A-Z][a-z]+){0,2}\b",
    0.6,
)
# 시/도 (optional) + 시/군/구 (one or two) + road name ending in 로/길 (optionally N번길) + building number
KOREAN_ROAD_ADDRESS = Pattern(
    "korean road address",
    r"(?:[가-힣]{2,}(?:특별자치시|특별자치도|특별시|광역시|도)\s?)?(?:[가-힣]{1,}(?:시|군|구)\s?){1,2}"
    r"(?:[가-힣]{1,}(?:읍|면|동)\s?)?[가-힣0-9]{1,}(?:로|길)(?:\s?\d{1,4}(?:번)?길)?\s?\d{1,5}(?:-\d{1,4})?",
    0.7,
)
KOREAN_PHONE = Pattern(
    "korean phone",
    r"(?<!\d)(?:\+82[-\s]?|0)(?:1[016789]|2|[3-6][1-5]|70)[-\s.]?\d{3,4}[-\s.]?\d{4}(?!\d)",
    0.6,
)


class OfflineEmailRecognizer(EmailRecognizer):
    """Presidio's email recognizer, validating domains against tldextract's bundled suffix list.

    The default extractor fetches the public suffix list over the network on first use."""

    _extract = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)

    def validate_result(self, pattern_text: str) -> bool:
        return self._extract(pattern_text).fqdn != ""


def project_recognizers(language: str) -> list[PatternRecognizer]:
    return [
        PatternRecognizer("PERSON", name="KoreanNameRecognizer", patterns=[KOREAN_NAME], supported_language=language),
        # case matters here: "Dr. Kim" is a name, "dr. said" is not
        PatternRecognizer("PERSON", name="TitledNameRecognizer", patterns=[ENGLISH_TITLED_NAME],
                          supported_language=language, global_regex_flags=re.DOTALL | re.MULTILINE),
        PatternRecognizer("LOCATION", name="KoreanRoadAddressRecognizer", patterns=[KOREAN_ROAD_ADDRESS],
                          supported_language=language),
        PatternRecognizer("PHONE_NUMBER", name="KoreanPhoneRecognizer", patterns=[KOREAN_PHONE],
                          supported_language=language),
    ]
