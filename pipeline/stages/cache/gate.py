"""The verification gate: whether a cached prompt asks the same thing as the query, word by word.

The gate compares the *words* of two prompts, by kind, from a morphological analysis (Kiwi for
Korean, spaCy for English: `engines/text_analyzer.py`). Every content word on one side must be
accounted for on the other: the same lemma, a known synonym, a morphological variant, or part of
a compound. What is left over decides:
- slots (nouns, names, adjectives, determiners) left over on *both* sides: a substitution, a
  different thing asked about -> fail ("reset my password" / "reset my router");
- verbs left over on both sides: a different action -> fail (cancel / change my order);
  English common nouns and verbs may pass on word-embedding similarity >= `word_match`;
- a slot left over on one side while the other side has only a stray verb in its place: the
  tagger called a noun a verb (bio) -> fail;
- slots on one side only: added detail, allowed when it is at most `added_words_max` generic
  (frequent) words and no name ("the latest version of the app" vs "on the router");
- a verb or adverb on one side only is rewording, unless it pins down a day, a time or a
  direction (`SPECIFIC`, + policy words): enable/disable, today/tomorrow must agree wherever they appear.
Numbers (digits and number words), masked entities and negation must agree exactly, and so must
what negation covers ("works on A but not on B" is not "works on B but not on A": a word negated
on one side may not stand un-negated on the other) and the kind of answer asked for (when /
where, how much / how: `QUESTION_KINDS`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline.engines.text_analyzer import Analysis, Token
from pipeline.stages.cache.config import CachePolicy
from pipeline.stages.cache.lexicon import (
    ALTERNATIVE,
    ANTONYMS,
    CLAUSE_BREAK,
    EN_NUMBER,
    KO_NATIVE,
    KO_OPPOSITE_PREFIX,
    KO_UNIT,
    MODALITY,
    NEGATION_COUNT,
    NEGATION_EN,
    NEGATION_KO,
    PHRASES,
    QUESTION_KIND_OVERLAP,
    QUESTION_KINDS,
    QUESTION_KINDS_BOTH,
    RELATIONS,
    SPECIFIC,
    SPECIFIC_KO,
    STOP_EN,
    STOP_KO,
    SYNONYMS,
    TIME_UNITS_H,
    WH_EN,
    WH_KO,
    YES_NO_EN,
)
from pipeline.stages.cache.order import (
    direction_flipped,
    out_of_order,
    pairing,
    phrase_moved,
    roles_swapped,
    scrambled,
    speaker_role_flipped,
    telegraphic,
    typed_clauses,
)
from pipeline.stages.cache.policy import PLACEHOLDER

# relations that the analysers do not count as content words but that change the question, by
# what they mean: "before" / 전에, "more" / "over" / 이상 ... (lexicon.RELATIONS)
LONG_PROMPT = 200  # characters: a prompt this long is context + ask, and the asks are compared alone


# compiled once: the standard library caches 512 patterns, and the gate's lists hold more (a
# recompile on every call cost 20 ms per candidate)
_QK = {k: [re.compile(p) for p in pats] for k, pats in QUESTION_KINDS.items()}
_REL = {k: [re.compile(p) for p in pats] for k, pats in RELATIONS.items()}
_ANT = [([re.compile(p) for p in left], [re.compile(p) for p in right]) for left, right in ANTONYMS]
_NEG = [re.compile(p) for p in NEGATION_COUNT]
_MOD = {k: [re.compile(p) for p in pats] for k, pats in MODALITY.items()}
_PHRASES = [(re.compile(p, re.IGNORECASE), w) for p, w in PHRASES]
_EN_NUMBER = re.compile(r"\b(" + "|".join(EN_NUMBER) + r")\b", re.IGNORECASE)


def _same_relations(query: str, candidate: str) -> bool:
    """Both prompts relate things, and by other words ("after I started" / "before I started"); a
    relation on one side only is rewording ("after ordering" / "I already placed the order")."""
    q, c = relations(query), relations(candidate)
    return not (q and c) or q == c


def opposite_prefixed(query: str, candidate: str) -> bool:
    """One prompt has 비공개 / 미결제 / 불포함 where the other has 공개 / 결제 / 포함 (KO_OPPOSITE_PREFIX)."""
    def one_way(a: str, b: str) -> bool:
        for m in re.finditer(r"(?<![가-힣])(" + "|".join(KO_OPPOSITE_PREFIX) + r")([가-힣]{2,})", a):
            word = m.group(1) + m.group(2)
            stems = {m.group(2)[:k] for k in range(2, len(m.group(2)) + 1)}
            if word[:3] not in b and any(re.search(rf"(?<![가-힣]){re.escape(st)}", b) for st in stems):
                return True
        return False

    return one_way(query, candidate) or one_way(candidate, query)


def modality(text: str) -> frozenset[str]:
    """may / must / must_not: what the prompt asks to be told about doing a thing (lexicon.MODALITY);
    "must not" is not also "must"."""
    lowered = text.lower()
    found = {k for k, pats in _MOD.items() if any(p.search(lowered) for p in pats)}
    if "must_not" in found and not any(p.search(re.sub(r"\bmust not\b|\bmustn't\b", "", lowered)) for p in _MOD["must"]):
        found.discard("must")
    return frozenset(found)


def negations(text: str) -> int:
    """How many negations a prompt holds (NEGATION_COUNT): an even number asserts."""
    lowered = text.lower()
    return sum(len(p.findall(lowered)) for p in _NEG)


def opposite_sides(query: str, candidate: str) -> bool:
    """One prompt says one side of an ANTONYMS pair and the other prompt only the other side."""
    q, c = query.lower(), candidate.lower()
    for left, right in _ANT:
        ql, qr = any(p.search(q) for p in left), any(p.search(q) for p in right)
        cl, cr = any(p.search(c) for p in left), any(p.search(c) for p in right)
        if (ql and not qr and cr and not cl) or (qr and not ql and cl and not cr):
            return True
    return False


def relations(text: str) -> frozenset[str]:
    lowered = text.lower()
    return frozenset(name for name, pats in _REL.items() if any(p.search(lowered) for p in pats))


def numbers(text: str) -> set[str]:
    """Quantities as digits: "5만원" = "50,000원", "two cards" = "2 cards", "두 번" = "2번"; time spans
    in hours, so "3주" is not "3일" and "14일" = "2주", "48 hours" = "two days"."""
    text = re.sub(r"(\d+(?:[.,]\d+)*)\s*(십|백|천|만|억)",
                  lambda m: str(int(float(m.group(1).replace(",", "")) * KO_UNIT[m.group(2)])), text)
    text = re.sub(r"(?<![가-힣])(한|두|세|네|다섯) ?(?=(?:번|개|장|명|달|시간|사람|가지|권|병|잔|대|살)(?![가-힣]{2}))",
                  lambda m: str(KO_NATIVE[m.group(1)]), text)
    text = _EN_NUMBER.sub(lambda m: str(EN_NUMBER[m.group(1).lower()]), text)
    out = set()
    for m in _QUANTITY.finditer(text):
        number = m.group(1).replace(",", "")
        hours = TIME_UNITS_H.get((m.group(2) or "").lower())
        out.add(f"{float(number) * hours:g}h" if hours else number)
    return out


# a number and the time unit after it, if any (longest unit first: "days" before "day", 주일 before 주)
_QUANTITY = re.compile(r"(\d+(?:[.,]\d+)*)(?:\s*(" + "|".join(sorted(map(re.escape, TIME_UNITS_H), key=len, reverse=True))
                       + r")(?![A-Za-z]))?", re.IGNORECASE)


def negated(text: str, analysis: Analysis | None = None) -> bool:
    lowered = text.lower()
    words = set(re.findall(r"[a-z']+", lowered))
    return (bool(words & NEGATION_EN) or "n't" in lowered or bool(re.search(r"\bnon-?[a-z]", lowered))
            or any(k in lowered for k in NEGATION_KO)
            or (analysis is not None and any(t.kind == "neg" for t in analysis.tokens)))


def yes_no(text: str) -> bool:
    """Does the prompt ask only whether (YES_NO_EN, WH_KO)?"""
    lowered = text.lower().strip()
    if not lowered.endswith("?") and not re.match(YES_NO_EN, lowered):
        return False
    if re.search(r"[가-힣]", lowered):
        return not any(w in lowered for w in WH_KO)
    # an auxiliary first asks whether ("is it ok to work out when I have a cold?"), unless it wraps
    # another question ("do you know where my order is?", "can you tell me why ...")
    return bool(re.match(YES_NO_EN, lowered)) and not re.search(r"\b(?:know|tell me|explain|show me)\b.*" + WH_EN,
                                                                    lowered)


def question_kinds(text: str) -> frozenset[str]:
    """The kinds of answer asked for (QUESTION_KINDS), or "yes_no" for a question that only asks whether."""
    lowered = text.lower()
    kinds = frozenset(k for k, pats in _QK.items() if any(p.search(lowered) for p in pats))
    if kinds:
        return kinds
    if yes_no(text):
        return frozenset({"yes_no"})
    if re.search(WH_EN, lowered) or any(w in lowered for w in WH_KO):
        return frozenset({"other"})
    return kinds  # a statement ("my battery drains fast"): it asks nothing in particular


def same_question(a: frozenset[str], b: frozenset[str]) -> bool:
    """Do two prompts ask for the same kind of answer? (QUESTION_KINDS; "whether" is not "where")"""
    if ("yes_no" in a) != ("yes_no" in b) and (a - {"yes_no"} or b - {"yes_no"}):
        return False
    def widen(kinds: frozenset[str]) -> set[str]:
        return set(kinds).union(*(QUESTION_KIND_OVERLAP.get(k, set()) for k in kinds))

    if a and b and not (widen(a) & widen(b)):
        return False
    for kind in QUESTION_KINDS_BOTH:  # a price, a person or a cause on one side: the other must ask it too
        other = b if kind in a else a
        if (kind in a) != (kind in b) and other and kind not in _widen_strict(other):
            return False
    return True


def _widen_strict(kinds: frozenset[str]) -> set[str]:
    """The kinds a prompt's kinds answer, without "other" (a bare what/which does not ask a price)."""
    return set(kinds).union(*(QUESTION_KIND_OVERLAP.get(k, set()) for k in kinds if k != "other"))


def clauses(text: str) -> list[str]:
    return [c for c in re.split(CLAUSE_BREAK, text, flags=re.IGNORECASE) if c and c.strip()]


def negation_moved(query: str, candidate: str, analyze: Callable[[str], Analysis], rules: GateRules) -> bool:
    """A content word negated in one prompt's clause stands un-negated in the other prompt (the
    negation moved to another argument). Only asked when both prompts are negated."""
    def split(text: str) -> tuple[list[Token], list[Token]]:
        negated_words: list[Token] = []
        plain: list[Token] = []
        for clause in clauses(text):
            words = content_tokens(analyze(normalise(clause)))
            (negated_words if negated(clause, analyze(normalise(clause))) else plain).extend(words)
        return negated_words, plain

    def moved(neg: list[Token], other_neg: list[Token], other_plain: list[Token]) -> bool:
        for t in neg:
            if any(rules.same_word(t.lemma, o.lemma) for o in other_neg):
                continue
            if any(rules.same_word(t.lemma, o.lemma) for o in other_plain):
                return True
        return False

    q_neg, q_plain = split(query)
    c_neg, c_plain = split(candidate)
    return moved(q_neg, c_neg, c_plain) or moved(c_neg, q_neg, q_plain)


def normalise(text: str) -> str:
    """What the analyser sees: placeholders out (compared on their own), hyphenated words joined,
    multi-word expressions as one word."""
    text = re.sub(r"(?<=\w)-(?=\w)", "", PLACEHOLDER.sub(" ", text))
    for pattern, word in _PHRASES:
        text = pattern.sub(word, text)
    return text


_SLOTS = ("noun", "name", "adj", "det")
_CONTENT = (*_SLOTS, "verb", "adv")


@dataclass(frozen=True)
class GateRules:
    """The gate's knobs and vocabulary, built once from the policy."""

    word_match: float = 0.8
    added_words_max: int = 2
    # an added word this frequent is generic (version, time, team); rarer ones name a specific
    # thing (router, laptop, 공유기): wordfreq Zipf scale, log10 of occurrences per billion words
    generic_zipf: float = 4.5
    synonyms: dict[str, frozenset[int]] = field(default_factory=dict)
    specific: frozenset[str] = frozenset()

    @classmethod
    def build(cls, policy: CachePolicy | None = None) -> GateRules:
        policy = policy or CachePolicy()
        index: dict[str, set[int]] = {}
        for i, group in enumerate([*SYNONYMS, *policy.gate_synonyms]):
            for w in group:
                index.setdefault(w.lower(), set()).add(i)
        return cls(word_match=policy.word_match, added_words_max=policy.gate_added_words_max,
                   generic_zipf=policy.gate_generic_zipf, synonyms={w: frozenset(g) for w, g in index.items()},
                   specific=frozenset(w.lower() for w in policy.gate_specific_words) | SPECIFIC | SPECIFIC_KO)

    def same_word(self, a: str, b: str) -> bool:
        return _same_word(a, b, self.synonyms)


def _same_word(a: str, b: str, synonyms: dict[str, frozenset[int]]) -> bool:
    if a == b or synonyms.get(a, frozenset()) & synonyms.get(b, frozenset()):
        return True
    # morphological variants: deliver/delivery, 화면녹화/녹화 (one contains the other, long enough)
    short, long_ = sorted((a, b), key=len)
    hangul = bool(re.match(r"[가-힣]", short))
    if len(short) >= (2 if hangul else 4) and long_.startswith(short) and len(long_) - len(short) <= 3:
        return True
    # Korean compounds with the same head and synonymous rest: 배송비/택배비
    if hangul:
        return len(short) >= 3 and a[-1] == b[-1] and _same_word(a[:-1], b[:-1], synonyms)
    # a typo: two neighbouring letters swapped in a longer word (chnage, usernmae)
    return len(a) == len(b) >= 5 and sorted(a) == sorted(b) and sum(x != y for x, y in zip(a, b)) == 2 and any(
        a[i] == b[i + 1] and a[i + 1] == b[i] for i in range(len(a) - 1))


def content_tokens(analysis: Analysis) -> list[Token]:
    out = []
    for t in analysis.tokens:
        if t.kind not in _CONTENT or t.surface in NEGATION_EN:
            continue
        if re.match(r"[가-힣]", t.lemma):
            if t.lemma in STOP_KO:
                continue
        elif t.lemma in STOP_EN or t.surface in STOP_EN or len(t.lemma) < 2:
            continue
        out.append(t)
    return out


def _specific(t: Token, specific: frozenset[str]) -> bool:
    if t.surface in specific or (re.match(r"[가-힣]", t.lemma) and t.lemma in specific):
        return True
    # lemma only for verbs and base forms: "latest" is not "late", "best" stays "best"
    return t.lemma in specific and (t.kind == "verb" or t.surface == t.lemma)


@dataclass
class GateVerdict:
    passed: bool
    checks: dict[str, bool] = field(default_factory=dict)
    reason: str = ""
    unmatched: list[str] = field(default_factory=list)
    # content words per side and those left unaccounted for: features of the verifier (verifier.py)
    words: tuple[int, int] = (0, 0)
    left_over: tuple[int, int] = (0, 0)


def _unmatched(tokens: list[Token], other: list[Token], other_compact: str, rules: GateRules) -> list[Token]:
    out = []
    for t in tokens:
        if any(rules.same_word(t.lemma, o.lemma) or rules.same_word(t.surface, o.surface) for o in other):
            continue
        if re.match(r"[가-힣]", t.lemma) and len(t.lemma) >= 2 and t.lemma in other_compact:
            continue  # Korean spacing: 학생 할인 vs 학생할인
        out.append(t)
    return out


def _substituted(side: list[Token], other: list[Token], word_similarity, word_match: float) -> list[str]:
    """The words of `side` that no word of `other` paraphrases: only English common nouns and verbs
    may pass on embedding similarity."""
    common = [t.lemma for t in side if t.kind in ("noun", "verb") and not re.match(r"[가-힣]", t.lemma)]
    others = [t.lemma for t in other if not re.match(r"[가-힣]", t.lemma)]
    close = word_similarity(common, others) if common and others else [0.0] * len(common)
    return [t.lemma for t in side if t.lemma not in common] + [w for w, s in zip(common, close) if s < word_match]


def alternatives(text: str, analyze: Callable[[str], Analysis]) -> list[tuple[str, str]]:
    """The content words on either side of each contrast marker (ALTERNATIVE): ("office", "home")
    for "to my office instead of my home"."""
    lowered = normalise(text).lower()
    out = []
    for m in re.finditer(ALTERNATIVE, lowered):
        before = content_tokens(analyze(lowered[:m.start()]))
        after = content_tokens(analyze(lowered[m.end():]))
        if before and after:
            out.append((before[-1].lemma, after[0].lemma))
    return out


def asks(text: str) -> str:
    """A long prompt's last sentence: the question it asks about the context before it."""
    parts = [p for p in re.split(r"(?<=[.?!])\s+|\n+", text.strip()) if p.strip()]
    return parts[-1] if len(parts) > 1 else ""


def order_kept(query: str, candidate: str, qa: Analysis, ca: Analysis, analyze: Callable[[str], Analysis],
               rules: GateRules) -> bool:
    """The words both prompts share stand in the same order; or one prompt is a keyword query; or
    one marked phrase moved (order.phrase_moved); or only whole clauses moved, each keeping its
    role ("can I return it if I lost the receipt" / "if I lost the receipt, can I return it"; not
    탈퇴하면 앱도 삭제돼요 / 앱 삭제하면 탈퇴도 돼요, where the condition changed). Any other move is
    refused: that is where roles are traded, and a refused paraphrase costs a miss, a wrong answer
    served costs more."""
    same = rules.same_word
    qt, ct = content_tokens(qa), content_tokens(ca)
    if not out_of_order([t.lemma for t in qt], [t.lemma for t in ct], same):
        return True
    if telegraphic(query, {t.surface for t in qt}) or telegraphic(candidate, {t.surface for t in ct}):
        return True
    nq, nc = normalise(query).lower(), normalise(candidate).lower()  # what the analyses' offsets index
    if phrase_moved(nq, nc, qt, ct, same):
        return True

    def clause_words(text: str) -> list[tuple[str, list[str]]]:
        parts = [(role, [t.lemma for t in content_tokens(analyze(text[lo:hi]))]) for role, lo, hi in typed_clauses(text)]
        return [(role, words) for role, words in parts if words]

    qc, cc = clause_words(normalise(query)), clause_words(normalise(candidate))
    if len(qc) < 2 or len(qc) != len(cc):
        return False
    unused, moved = list(range(len(cc))), []
    for role, words in qc:  # undo the moves: each query clause takes the candidate clause of its role it shares most with
        best = max((j for j in unused if cc[j][0] == role), default=None,
                   key=lambda j: sum(any(same(w, x) for x in cc[j][1]) for w in words))
        if best is None:
            return False
        unused.remove(best)
        moved.append(best)
    q_words = [w for _, words in qc for w in words]
    c_words = [w for j in moved for w in cc[j][1]]
    return not out_of_order(q_words, c_words, same)


@dataclass
class _Words:
    bad: list[str]
    words: tuple[int, int]
    left_over: tuple[int, int]


def _content_words(query: str, candidate: str, analyze: Callable[[str], Analysis], word_similarity,
                   rules: GateRules, qa: Analysis | None = None, ca: Analysis | None = None) -> _Words:
    """The words of each prompt the other does not account for, and which of them break the match."""
    qa = qa or analyze(normalise(query))
    ca = ca or analyze(normalise(candidate))
    qt, ct = content_tokens(qa), content_tokens(ca)
    q_un = _unmatched(qt, ct, re.sub(r"\s+", "", candidate.lower()), rules)
    c_un = _unmatched(ct, qt, re.sub(r"\s+", "", query.lower()), rules)
    bad = [t.lemma for t in q_un + c_un if _specific(t, rules.specific)]
    # a word said twice on one side stands for a word of the other that nothing else accounts for:
    # "cancel the payment, are the points cancelled" / "... are the points kept" (취소 ... 취소 / 유지)
    paired = pairing([t.lemma for t in qt], [t.lemma for t in ct], rules.same_word)
    q_twice = [t for i, t in enumerate(qt) if i not in paired.values() and t not in q_un
               and any(k != i and rules.same_word(t.lemma, o.lemma) for k, o in enumerate(qt))]
    c_twice = [t for j, t in enumerate(ct) if j not in paired and t not in c_un
               and any(k != j and rules.same_word(t.lemma, o.lemma) for k, o in enumerate(ct))]
    if (q_twice and any(t.kind in (*_SLOTS, "verb") for t in c_un)) or (
            c_twice and any(t.kind in (*_SLOTS, "verb") for t in q_un)):
        bad += [t.lemma for t in q_twice + c_twice + q_un + c_un]
    q_slots = [t for t in q_un if t.kind in _SLOTS]
    c_slots = [t for t in c_un if t.kind in _SLOTS]
    q_verbs = [t for t in q_un if t.kind == "verb"]
    c_verbs = [t for t in c_un if t.kind == "verb"]
    for q_side, c_side in ((q_slots, c_slots), (q_verbs, c_verbs)):
        if q_side and c_side:  # a substitution: each side names a thing (or an action) the other does not
            bad += _substituted(q_side, c_side, word_similarity, rules.word_match)
            bad += _substituted(c_side, q_side, word_similarity, rules.word_match)
    if not (q_slots and c_slots):
        slots, own, theirs = (q_slots, q_verbs, c_verbs) if q_slots else (c_slots, c_verbs, q_verbs)
        if slots and theirs and not own:
            bad += [t.lemma for t in slots + theirs]  # a word of another kind stands where a slot was
        elif len(slots) > rules.added_words_max or any(t.kind == "name" or t.zipf < rules.generic_zipf for t in slots):
            bad += [t.lemma for t in slots]  # added detail: only a little, and only generic words
    return _Words(bad, (len(qt), len(ct)), (len(q_un), len(c_un)))


def gate(query: str, candidate: str, analyze: Callable[[str], Analysis], word_similarity,
         rules: GateRules) -> GateVerdict:
    """Do query and cached prompt ask the same thing? (the rules are above)

    `word_similarity(words, against)` lets close English common nouns count as the same word
    (>= rules.word_match); names, adjectives and Korean words never pass on similarity: co-hyponyms
    (Canada/Mexico, 부산/대전) embed close together.

    Cheapest first: when numbers or entities differ the verdict is already a fail, so the
    analysis and the word embeddings (most of a lookup's cost) are skipped,
    and `checks` holds only the checks that ran."""
    checks = {
        "numbers": numbers(query) == numbers(candidate),
        "entities": set(PLACEHOLDER.findall(query)) == set(PLACEHOLDER.findall(candidate)),
        "relations": (_same_relations(query, candidate) and not opposite_prefixed(query, candidate)
                      and not opposite_sides(query, candidate)),
    }
    if not all(checks.values()):
        failed = [k for k, ok in checks.items() if not ok]
        return GateVerdict(passed=False, checks=checks, reason="gate_failed:" + ",".join(failed))
    checks["question"] = same_question(question_kinds(query), question_kinds(candidate))
    qa, ca = analyze(normalise(query)), analyze(normalise(candidate))
    q_negated, c_negated = negated(query, qa), negated(candidate, ca)
    checks["negation"] = q_negated == c_negated and negations(query) == negations(candidate)
    if q_negated and c_negated:
        checks["negation_scope"] = not negation_moved(query, candidate, analyze, rules)
    # a pure permutation of the same words (no word reworded) that no single move gives: roles traded
    permuted = sorted(re.findall(r"\w+", query.lower())) == sorted(re.findall(r"\w+", candidate.lower()))
    checks["roles"] = not roles_swapped(query, candidate, qa, ca) and not speaker_role_flipped(query, candidate) \
        and not (permuted and scrambled(
        [t.lemma for t in content_tokens(qa)], [t.lemma for t in content_tokens(ca)]))
    checks["order"] = order_kept(query, candidate, qa, ca, analyze, rules) and not direction_flipped(
        normalise(query).lower(), normalise(candidate).lower(), content_tokens(qa), content_tokens(ca), rules.same_word)
    q_mod, c_mod = modality(query), modality(candidate)
    checks["modality"] = not (q_mod and c_mod and q_mod != c_mod)
    q_alt, c_alt = alternatives(query, analyze), alternatives(candidate, analyze)
    if q_alt and c_alt:  # the same two things, set against each other the other way round
        checks["alternatives"] = not any(rules.same_word(x, y2) and rules.same_word(y, x2) and not rules.same_word(x, y)
                                  for x, y in q_alt for x2, y2 in c_alt)
    words = _content_words(query, candidate, analyze, word_similarity, rules, qa, ca)
    checks["content_words"] = not words.bad
    bad = list(words.bad)
    if len(query) > LONG_PROMPT and len(candidate) > LONG_PROMPT and asks(query) and asks(candidate):
        # a shared context accounts for every word of either question: compare the questions alone
        ask = _content_words(asks(query), asks(candidate), analyze, word_similarity, rules)
        checks["ask"] = not ask.bad and same_question(question_kinds(asks(query)), question_kinds(asks(candidate)))
        bad += ask.bad
    failed = [k for k, ok in checks.items() if not ok]
    return GateVerdict(passed=not failed, checks=checks, reason=("gate_failed:" + ",".join(failed)) if failed else "gate_passed",
                       unmatched=sorted(set(bad)), words=words.words, left_over=words.left_over)
