"""Person-name recognizers: Korean names by honorific, by role cue and by particle; English names
after a title or a cue; and spaCy's English NER for names with no cue at all.

Korean names mostly have no honorific in chat ("박서연이 주문했어요"), so the particle rule looks at
every Hangul word that is a surname plus a two-syllable given name (or a two-syllable surname plus
two) before a particle, a comma or a space, and keeps it unless the word is a known Korean word
(wordfreq) or a frequent word plus a noun suffix (배송+지, 이번+주). Kiwi's proper-noun tag
rescues a name whose first two syllables happen to be a word (안도+현). A false positive costs a
placeholder; a miss leaks, so ties go to masking.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import threading
import warnings
from functools import lru_cache
from typing import Any

import regex as re
from presidio_analyzer import EntityRecognizer, Pattern, RecognizerResult
from presidio_analyzer.nlp_engine import NlpArtifacts

log = logging.getLogger(__name__)

# The most common Korean surnames (two-syllable ones first so they win the alternation).
_SURNAMES_2 = "남궁|황보|제갈|선우|독고|사공|서문"
_SURNAMES_1 = (
    "김|이|박|최|정|강|조|윤|장|임|한|오|서|신|권|황|안|송|류|유|전|홍|고|문|양|손|배|백|허|남|심|노|하|곽|"
    "성|차|주|우|구|민|진|지|엄|채|원|천|방|공|현|함|변|염|여|추|도|소|석|선|설|마|길|연|위|표|명|기|반|라|"
    "왕|금|옥|육|인|맹|제|모|탁|국|어|은|편|용|예|경|봉|사|부|가|복|태|목|형|피|두|감|음|빈|동|온|호|범|좌"
)
_SURNAMES = f"{_SURNAMES_2}|{_SURNAMES_1}"
SURNAMES_1 = frozenset(_SURNAMES_1.split("|"))
SURNAMES_2 = frozenset(_SURNAMES_2.split("|"))
_TITLES = "고객|선생|과장|부장|대리|사장|팀장|교수|원장|회원|실장|차장|주임|이사|대표|간호사|기사"

KOREAN_HONORIFIC_NAME = Pattern(
    "korean name before an honorific",
    rf"(?<![가-힣])(?!(?:{_TITLES}|부모|형제|자매|부부|모녀|부자|이모|고모|이모부|고모부)\s?(?:(?:{_TITLES})\s?)?(?:님|씨))(?:{_SURNAMES})[가-힣]{{1,2}}"
    rf"(?=\s?(?:(?:{_TITLES})\s?)?(?:님|씨(?!앗|름)))",
    0.7,
)
# one lookbehind (ten alternative lookbehinds cost 40 ms per 32k chars); the dots are literal now
ENGLISH_TITLED_NAME = Pattern(
    "english name after a title",
    r"(?<=\b(?:(?:Mrs?|Ms|Miss|Mx|Dr)\.?|Prof\.)\s)[A-Z][a-z]{1,30}(?:\s[A-Z][a-z]{1,30}){0,2}\b",
    0.6,
)
_NAME_WORD = r"\p{Lu}[\p{Ll}'’-]{1,30}(?:-\p{Lu}\p{Ll}{1,30})?"
# "my name is Ana Souza", "Name: Jörg Weber", "Regards,\nPriya Nair", "this is Tom from billing"
ENGLISH_CUED_NAME = Pattern(
    "name after a cue",
    rf"(?<=\b(?:(?i:my\s(?:name\sis|name's)|i\sam|i'm|this\sis|name|full\sname|signed|regards|cheers|thanks|"
    rf"sincerely|best|contact|ask\sfor|attn|attention|cc|from|by|named|called|"
    rf"customer|account\sholder|cardholder|recipient|sender|patient|employee))\s?[:,]?\s{{1,2}})"
    rf"{_NAME_WORD}(?:\s(?:(?:van|von|de|del|da|di|der|den|la|le|bin|al)\s)?{_NAME_WORD}){{1,3}}\b",
    0.6,
)

# a name in capitals on a form: "Name: BRENDAN KILBRIDE", "성명 SANTOS MARIA CLARA"
CAPITALS_CUED_NAME = Pattern(
    "name in capitals after a cue",
    r"(?<=(?:\b(?i:name|full\sname|cardholder|card\sholder|holder|applicant|passenger)|성명|이름|영문\s?이름|영문명)"
    r"\s?[:：]?\s{1,2})\p{Lu}{2,20}(?:[\s,]\s?\p{Lu}{2,20}){1,3}\b",
    0.6,
)

# ---- Korean names by particle ------------------------------------------------------------------

_PARTICLES = sorted(
    ("이", "가", "은", "는", "을", "를", "의", "에게", "한테", "께", "께서", "하고", "랑", "이랑", "과", "와", "도",
     "만", "에게서", "한테서", "이가", "이는", "이를", "이의", "이에게", "이한테", "이랑", "이하고", "이도", "이만",
     "입니다", "이에요", "예요", "이었어요", "였어요", "였습니다", "이었습니다", "이고", "이며", "이나", "나", "야",
     "아", "님", "씨", "군", "양", "선생님", "고객님", "측", "쪽", "로부터", "으로부터", "부터", "까지", "처럼", "보다",
     "이요", "인데", "인데요", "이라고", "라고", "이라는", "라는", "에게는", "한테는", "께서는", "에게도", "한테도",
     "네", "이네", "이란", "란", "이면", "이시고", "이세요", "님께", "씨가", "씨는", "씨의", "씨에게"),
    key=len, reverse=True)
# a role word that introduces a person: 이름: 김민준, 수령인은 최도윤
_KO_CUE = re.compile(r"(?:이름|성명|성함|담당자|주문자|수령인|수령자|받는\s?분|받는\s?사람|보내는\s?분|보내는\s?사람|작성자|"
                     r"신청자|신청인|환자|접수|확인|근로자|학생|직원|예약자|고객명|대표자|보호자|환자명|명의자|예금주|계좌주|가입자|결제자|구매자|판매자|발신자|"
                     r"수신자|참석자|문의자|요청자|사용자명|아들|딸|남편|아내|부인|엄마|아빠|어머니|아버지|동생|형|누나|"
                     r"오빠|언니|친구|동료|조카|손자|손녀|사위|며느리)\s?(?:[:：=]|은|는|이|가|명)?\s?$")
# a title or honorific right after a name, as a separate word: 배준영 과장이, 김민준 님
_KO_TITLE_AFTER = re.compile(r"\s(?:고객|선생|과장|부장|대리|사장|팀장|교수|원장|회원|실장|차장|주임|이사|대표|간호사|"
                             r"기사|작가|씨|님|군|양|매니저|선수|감독|변호사|의사|박사)")
_HANGUL_WORD = re.compile(r"(?<![가-힣])[가-힣]{3,9}(?![가-힣])")
# second part of a compound noun after a frequent first word: 배송+지, 이번+주, 최저+가, 주문+서
_NOUN_SUFFIX = set("지가주서자문부일금표비료권실장점사원층용형식법품기물국관소처제율액량별상성화적력감대도함간선내외후전중들경측쪽")  # noqa: E501 - word data


_KIWI: Any = None
_KIWI_LOCK = threading.Lock()


_KIWI_LAST: tuple[str, tuple[Any, ...]] = ("", ())


def kiwi_tokens(text: str) -> tuple[Any, ...]:
    """Kiwi's morphemes for `text`: one analyser per process (it is not thread-safe: one lock).

    The last answer is kept: two recognizers ask for the same window in turn, and Kiwi is most of
    the cost of masking Korean (0.2 s of a 32k-character prompt, each time)."""
    global _KIWI, _KIWI_LAST
    with _KIWI_LOCK:
        if _KIWI_LAST[0] == text and text:
            return _KIWI_LAST[1]
        if _KIWI is None:
            from kiwipiepy import Kiwi

            with warnings.catch_warnings():  # "num_workers=0 changed in 0.21": one thread, as wanted
                warnings.simplefilter("ignore", DeprecationWarning)
                _KIWI = Kiwi(num_workers=0, load_multi_dict=False, load_typo_dict=False)
        tokens = tuple(_KIWI.tokenize(text))
        _KIWI_LAST = (text, tokens)
        return tokens


@lru_cache(maxsize=1)
def _ko_zipf():
    from wordfreq import get_frequency_dict

    freq = get_frequency_dict("ko", wordlist="best")  # looked up directly: its Korean tokenizer needs MeCab
    return lambda w: math.log10(freq[w] * 1e9) if freq.get(w) else 0.0


class KoreanParticleNameRecognizer(EntityRecognizer):
    """Korean names with no honorific: surname + given name before a particle, a comma or a space."""

    KNOWN_WORD_ZIPF = 2.0  # the whole stem is a word at or above this: not a name, unless Kiwi says so
    PREFIX_WORD_ZIPF = 2.0  # all but the last syllable are a word this frequent: a compound, unless Kiwi says name

    def __init__(self, supported_language: str = "en") -> None:
        super().__init__(supported_entities=["PERSON"], name="KoreanParticleNameRecognizer",
                         supported_language=supported_language)

    def load(self) -> None:  # Presidio calls this at construction: no I/O there (see warm)
        pass

    def warm(self) -> None:
        """Load Kiwi and the word lists now (seconds), not on the first request that needs them."""
        _ko_zipf()
        name_lists()
        self._kiwi_names("준비")

    @staticmethod
    def _kiwi_names(text: str) -> set[tuple[int, int]]:
        return {(t.start, t.start + t.len) for t in kiwi_tokens(text) if t.tag == "NNP"}

    @staticmethod
    def _stems(word: str, whole: bool) -> list[str]:
        """Name-shaped stems of `word`: the word minus a particle, and the word itself when `whole`."""
        out = [word[: -len(p)] for p in _PARTICLES if word.endswith(p) and len(word) - len(p) in (3, 4)]
        if whole and len(word) in (3, 4):
            out.append(word)
        return [stem for stem in out
                if (len(stem) == 3 and stem[0] in SURNAMES_1) or (len(stem) == 4 and stem[:2] in SURNAMES_2)]

    def analyze(self, text: str, entities: list[str], nlp_artifacts: NlpArtifacts | None = None
                ) -> list[RecognizerResult]:
        zipf = _ko_zipf()
        ko_given = name_lists()[2]
        results: list[RecognizerResult] = []
        kiwi_names: set[tuple[int, int]] | None = None
        last_end = -10
        for m in _HANGUL_WORD.finditer(text):
            # the next name of a list (신하람, 구태현, 표지율): the list vouches for it unless it is a word
            chained = m.start() - last_end <= 2 and text[last_end:m.start()].strip() in (",", "·", "/")
            # the whole word may be a name where a list, a line or the text ends after it, after a role
            # word or before a title, or in a list; before a plain space it is usually a noun + ending
            after, before = text[m.end():m.end() + 1], text[max(0, m.start() - 12):m.start()]
            next_mark = text[m.end():m.end() + 3].lstrip(" ")[:1]
            whole = (chained or not after or after in ",/·)\n;" or next_mark in ("/", "(", "|", "")
                     or bool(_KO_CUE.search(before)) or bool(_KO_TITLE_AFTER.match(text, m.end())))
            for stem in self._stems(m.group(), whole):
                head = stem[:-1]
                # a common given name after a surname (민+서윤) is a name; a known word (강아지) or a
                # frequent word + one syllable (배송+지, 인증+을) only where Kiwi tags a proper noun
                listed = stem[-2:] in ko_given or (chained and zipf(stem) < self.KNOWN_WORD_ZIPF)
                if not listed and (zipf(stem) >= self.KNOWN_WORD_ZIPF or zipf(head) >= self.PREFIX_WORD_ZIPF):
                    if stem[-1] in _NOUN_SUFFIX and zipf(head) >= self.PREFIX_WORD_ZIPF:
                        continue  # 배송+지, 이번+주: a compound noun, whatever Kiwi says
                    if kiwi_names is None:
                        kiwi_names = self._kiwi_names(text)
                    if (m.start(), m.start() + len(stem)) not in kiwi_names:
                        continue
                results.append(RecognizerResult("PERSON", m.start(), m.start() + len(stem), 0.6))
                last_end = m.start() + len(stem)
                break
        return results


# ---- names from a gazetteer (Faker's per-locale name lists) -------------------------------------


@lru_cache(maxsize=1)
def name_lists() -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """(Latin-script given names, Latin-script family names, Korean given names), lower-cased, from
    Faker's person providers for every locale it ships (~21k given names, ~18k family names)."""
    import importlib
    import pkgutil

    import faker.providers.person as person

    first: set[str] = set()
    last: set[str] = set()
    ko_given: set[str] = set()
    latin = re.compile(r"\p{Latin}[\p{Latin}'’-]+")
    for mod in pkgutil.iter_modules(person.__path__):
        try:
            provider = importlib.import_module(f"{person.__name__}.{mod.name}").Provider
        except (ImportError, AttributeError):
            continue
        for attr, names in provider.__dict__.items():  # first_names, first_names_female, last_names_male, ...
            into = first if attr.startswith("first_names") else last if attr.startswith("last_names") else None
            if into is not None and isinstance(names, (list, tuple, dict)):
                into.update(n.lower() for n in names if isinstance(n, str) and latin.fullmatch(n))
        if mod.name == "ko_KR":
            ko_given.update(provider.__dict__.get("first_names", ()))
    return frozenset(first), frozenset(last), frozenset(ko_given)


_LATIN_WORD = re.compile(r"\p{Latin}[\p{Latin}'’-]{1,30}")
_CAP_WORD = r"\p{Lu}\p{Ll}[\p{Ll}'’-]{1,24}"
_PARTICLE_NAME = re.compile(rf"\b({_CAP_WORD})(?:\s{_CAP_WORD})?\s(?:de|van|van der|van den|von|der|da|di|del|della|"
                            rf"dos|das|i|y|bin|al|ibn|Ó|O'|Mac|le|la)\s{_CAP_WORD}\b")
_CAPITALISED_PAIR = re.compile(rf"(?<![\p{{L}}'’-])({_CAP_WORD})\s({_CAP_WORD})(?![\p{{L}}'’-])")
_LONE_CAPITALISED = re.compile(rf"(?<![\p{{L}}'’-]|\b(?:the|a|an|The|A|An)\s){_CAP_WORD}(?!\s\p{{Lu}})(?![\p{{L}}'’-])")
_CHAT_CUED = re.compile(r"(?<=\b(?:hi|hey|hello|yo|ask|tell|call|text|ping|from|with|it's|its|did|and|me,|thx|thanks|"
                        r"ty|when|what|whether|if|lmk|cc|dear|bye)\s)"
                        r"([a-zà-ÿ][a-zà-ÿ'-]{1,20}(?:\s[a-zà-ÿ][a-zà-ÿ'-]{1,20}){0,2})")
# a chat log's speaker ("[10:42] heike: ...") and a sign-off ("thx - nneka"): one listed given name
_SPEAKER_OR_SIGNOFF = re.compile(r"(?:^|\n|\]\s)([a-zà-ÿ][a-zà-ÿ'-]{1,20})(?=:\s)|[-–—]\s([a-zà-ÿ][a-zà-ÿ'-]{1,20})\s*$")


class GazetteerNameRecognizer(EntityRecognizer):
    """Two or three words that read as given name + family name: "Priya Natarajan" (a listed given
    name before a capitalised word that is a listed family name or no common English word), and in
    casual lower case "anna kowalski" (both listed, neither a common word). spaCy's small model
    misses names in short, informal or non-English text; a list does not care about context."""

    COMMON_WORD_ZIPF = 4.5

    def __init__(self, supported_language: str = "en") -> None:
        super().__init__(supported_entities=["PERSON"], name="GazetteerNameRecognizer",
                         supported_language=supported_language)

    def load(self) -> None:  # Presidio calls this at construction: no I/O there (see warm)
        pass

    def warm(self) -> None:
        name_lists()

    def analyze(self, text: str, entities: list[str], nlp_artifacts: NlpArtifacts | None = None
                ) -> list[RecognizerResult]:
        from wordfreq import zipf_frequency

        first, last, _ = name_lists()

        def common(w: str) -> bool:
            return zipf_frequency(w.lower(), "en") >= self.COMMON_WORD_ZIPF

        words = list(_LATIN_WORD.finditer(text))
        out: list[RecognizerResult] = []
        i = 0
        while i < len(words) - 1:
            w1, w2 = words[i], words[i + 1]
            a, b = w1.group(), w2.group()
            adjacent = text[w1.end():w2.start()] == " "
            cased = a[0].isupper() and b[0].isupper() and not a.isupper() and not b.isupper()
            if adjacent and a.lower() in first and (
                    (cased and (b.lower() in last or not common(b)) and (not common(a) or b.lower() in last))
                    or (a.islower() and b.islower() and b in last and not common(b))):
                end, j = w2.end(), i + 2
                if j < len(words) and text[end:words[j].start()] == " " and words[j].group()[0].isupper() == cased \
                        and words[j].group().lower() in last:
                    end, j = words[j].end(), j + 1  # a middle name: Ravi Shankar Iyer
                out.append(RecognizerResult("PERSON", w1.start(), end, 0.6))
                i = j
                continue
            i += 1
        return out + self._rare_names(text, first, last)

    @staticmethod
    def _rare_names(text: str, first: frozenset[str], last: frozenset[str]) -> list[RecognizerResult]:
        """Names the bigram rule above misses:
        - family-name particles: Femke de Graaf, Núria Puig i Ferrer, Cormac Ó Briain;
        - two capitalised words English rarely uses, one of them listed: Karthik Ramaswamy, Tunde Bakare;
        - one capitalised given name English almost never uses, alone: "Can Elif sign", "Thanks Rahul";
        - a listed given name in lower-case chat after a cue: "ask jiwoo", "hi mohammed", "me, daniela and kwame"."""
        from wordfreq import zipf_frequency

        def rare(w: str, below: float) -> bool:
            return zipf_frequency(w.lower(), "en") < below

        out = []
        for m in _PARTICLE_NAME.finditer(text):
            if m.group(1).lower() in first:
                out.append(RecognizerResult("PERSON", m.start(), m.end(), 0.6))
        for m in _CAPITALISED_PAIR.finditer(text):
            a, b = m.group(1), m.group(2)
            if (a.lower() in first or b.lower() in last or a.lower() in last) and rare(a, 3.5) and rare(b, 3.5):
                out.append(RecognizerResult("PERSON", m.start(), m.end(), 0.6))
        for m in _LONE_CAPITALISED.finditer(text):
            w = m.group()
            if w.lower() in first and rare(w, 3.5) and not w.isupper():
                out.append(RecognizerResult("PERSON", m.start(), m.end(), 0.5))
        for m in _SPEAKER_OR_SIGNOFF.finditer(text):
            g = 1 if m.group(1) else 2
            if m.group(g) in first and rare(m.group(g), 4.3):
                out.append(RecognizerResult("PERSON", m.start(g), m.end(g), 0.5))
        for m in _CHAT_CUED.finditer(text, overlapped=True):  # "lmk when ishita": cue after cue
            words = m.group(1).split()
            if words[0] in first and rare(words[0], 4.3):
                end = m.start(1) + len(words[0])
                for w in words[1:]:  # ana beatriz ferreira: more listed names follow
                    if w in first or w in last:
                        end = text.index(w, end) + len(w)
                    else:
                        break
                out.append(RecognizerResult("PERSON", m.start(1), end, 0.5))
        return out


# ---- English names by NER ----------------------------------------------------------------------


class SpacyPersonRecognizer(EntityRecognizer):
    """PERSON spans from a spaCy pipeline's NER (the other components are excluded: 3x cheaper).

    Only spans with a Latin letter count (the English model guesses on Hangul), and an
    all-lower-case span only when one of its words is a listed name ("zzqbroken zzqbroken" came
    back a PERSON, and the route never saw the prompt; "anna kowalski" is kept)."""

    COMMON_WORD_ZIPF = 4.5  # "will", "may", "email": words first, names rarely

    def __init__(self, model: str, supported_language: str = "en") -> None:
        self.model = model
        self._nlp: Any = None
        self._lock = threading.Lock()
        super().__init__(supported_entities=["PERSON"], name="SpacyPersonRecognizer",
                         supported_language=supported_language)

    @staticmethod
    def available(model: str) -> bool:
        return importlib.util.find_spec(model) is not None

    def load(self) -> None:  # Presidio calls this at construction: no I/O there (see warm)
        pass

    def warm(self) -> None:
        with self._lock:
            self._pipeline()("warm up")

    def _pipeline(self) -> Any:
        if self._nlp is None:
            import spacy

            nlp = spacy.load(self.model)
            keep = {"ner"}
            self._nlp = spacy.load(self.model, exclude=[p for p in nlp.pipe_names if p not in keep])
        return self._nlp

    @staticmethod
    def _not_a_lone_name(word: str, after: str) -> bool:
        """A one-word PERSON guess that is lower-case, a form label ("Lieferadresse:"), all capitals,
        or a very common English word (Email, Will, May) is dropped; two words are always kept."""
        from wordfreq import zipf_frequency

        return (not word[:1].isupper() or after == ":" or (len(word) > 1 and word.isupper())
                or zipf_frequency(word.lower(), "en") >= SpacyPersonRecognizer.COMMON_WORD_ZIPF)

    @staticmethod
    def _common_tail(word: str) -> bool:
        from wordfreq import zipf_frequency

        w = word.lower().strip(".,")
        return zipf_frequency(w, "en") >= 3.8 and w not in name_lists()[0] and w not in name_lists()[1]

    def analyze(self, text: str, entities: list[str], nlp_artifacts: NlpArtifacts | None = None
                ) -> list[RecognizerResult]:
        if not re.search(r"\p{Latin}", text):
            return []
        with self._lock:  # spaCy pipelines are not thread-safe
            doc = self._pipeline()(text)
        out = []
        for ent in doc.ents:
            if ent.label_ != "PERSON" or not re.search(r"\p{Latin}", ent.text) or re.search(r"\d", ent.text):
                continue
            words = ent.text.split()
            if not any(w[:1].isupper() for w in words) and not any(
                    w.lower() in name_lists()[0] or w.lower() in name_lists()[1] for w in words):
                continue  # the small model leans on capitals: in lower case a listed name must confirm it
            if len(ent) == 1 and self._not_a_lone_name(ent.text, text[ent.end_char:ent.end_char + 1]):
                continue
            if len(ent) == 1 and ent.text.lower() not in name_lists()[0]:
                continue  # alone, a name is a given name (a family name comes after a title): Porto, Pixel
            if len(ent) > 1 and self._common_tail(words[-1]):
                continue  # Columbus Day, Bill Pay, Lincoln Tunnel, Visa Infinite: a thing named after someone
            start, end = ent.start_char, ent.end_char
            if text[end - 2:end] in ("'s", "’s"):
                end -= 2
            out.append(RecognizerResult("PERSON", start, end, 0.85))
        return out
