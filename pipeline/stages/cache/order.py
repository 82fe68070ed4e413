"""Which word plays which role: the gate's order-sensitive checks. Two prompts with the same words
can ask opposite things when two of them trade places ("from savings to checking" / "from checking
to savings", 포인트로 상품권 / 상품권으로 포인트); moving one clause does not change the question.

Markers: in English the word before a word (past determiners), in Korean the particle on its 어절.
"""

from __future__ import annotations

import re

from pipeline.engines.text_analyzer import Analysis
from pipeline.stages.cache.lexicon import STOP_EN

_DETERMINERS = frozenset({"the", "a", "an", "my", "your", "our", "his", "her", "their", "this", "that", "its",
                          "some", "any", "all", "every", "each", "both"})


_PREPOSITIONS = frozenset({"from", "to", "into", "onto", "as", "by", "in", "on", "at", "for", "via", "than", "with",
                           "over", "under", "of"})


def _roles(text: str, analysis: Analysis) -> dict[str, tuple[str, int, str]]:
    """Each word that occurs once -> (the word that marks its role, position, what follows). English:
    the word before it, past determiners ("from my savings" -> from); Korean: the particle on its
    어절 (부산에서 -> 에서) and the next 어절 (할부로 산 / 일시불로 바꿀: one particle, two roles)."""
    out: dict[str, tuple[str, int, str]] = {}
    if re.search(r"[가-힣]", text):
        nouns = {t.surface for t in analysis.tokens if t.kind in ("noun", "name") and re.match(r"[가-힣]", t.surface)}
        eojeols = re.findall(r"[가-힣A-Za-z0-9]+", text)
        for i, e in enumerate(eojeols):
            stem = max((n for n in nouns if e.startswith(n)), key=len, default="")
            if stem and sum(x.startswith(stem) for x in eojeols) == 1:
                out[stem] = (e[len(stem):], i, eojeols[i + 1] if i + 1 < len(eojeols) else "")
        return out
    nouns = {t.surface for t in analysis.tokens if t.kind in ("noun", "name")}
    nouns |= {n[:-1] for n in nouns if len(n) > 3 and n.endswith("s")}
    words = re.findall(r"[A-Za-z0-9']+", text)
    lowered = [w.lower()[:-1] if len(w) > 3 and w.lower().endswith("s") and not w.lower().endswith("ss") else w.lower()
               for w in words]
    for i, (w, lw) in enumerate(zip(words, lowered)):
        if lowered.count(lw) != 1 or lw in _DETERMINERS or (lw in STOP_EN and not w.isupper()):
            continue
        j = i - 1
        while j >= 0 and lowered[j] in _DETERMINERS:
            j -= 1
        marker = lowered[j] if j >= 0 else "^"  # "^": it opens the prompt ("My fever went away")
        if lw in nouns or marker in _PREPOSITIONS:  # the tagger calls "checking" a verb after "to"
            out[lw] = (marker, i, lowered[i + 1] if i + 1 < len(lowered) else "$")
    return out


def roles_swapped(query: str, candidate: str, qa: Analysis, ca: Analysis) -> bool:
    """Words trade roles: "from my savings to checking" / "from my checking to savings", 부산에서
    서울로 / 서울에서 부산으로, "one email linked to multiple accounts" / "one account linked to
    multiple emails": a word both prompts share took the marker (the word before it; in Korean, its
    particle) that another shared word had, and the two changed order. Word order alone is not a
    swap: a moved word keeps its marker (내일까지 서울로 / 서울로 내일까지)."""
    q, c = _roles(query, qa), _roles(candidate, ca)
    both = [w for w in q if w in c]
    kq, kc = _keys(q, both), _keys(c, both)
    for x in both:
        for y in both:
            if x != y and kq[x] not in ("^", "", "+") and kq[x] == kc[y] and kc[x] not in (kq[x], "+") \
                    and (q[x][1] < q[y][1]) != (c[x][1] < c[y][1]):
                return True
    return False


_PARTICLE_FORMS = {"으로": "로", "이": "가", "은": "는", "을": "를", "과": "와", "이랑": "랑", "으로는": "로는"}


def _keys(roles: dict[str, tuple[str, int, str]], shared: list[str]) -> dict[str, str]:
    """Each shared word's marker: a shared word as marker is a compound ("+": account owner, gmail
    contacts), no role;
    two words with one marker are told apart by the word after them (with Google if / with email?)."""
    keys = {}
    for w in shared:
        marker = roles[w][0]
        keys[w] = "+" if marker in shared else _PARTICLE_FORMS.get(marker, marker)
    counts: dict[str, int] = {}
    for k in keys.values():
        counts[k] = counts.get(k, 0) + 1
    return {w: (k + "|" + roles[w][2] if k not in ("", "+") and counts[k] > 1 else k) for w, k in keys.items()}


def scrambled(q: list[str], c: list[str]) -> bool:
    """The same content words in an order that no single move of one stretch of words gives: "a
    sale item for a full price one" / "a full price item for a sale one", "one email ... multiple
    accounts" / "one account ... multiple emails". Moving one clause or phrase is rewording
    (내일까지 서울로 / 서울로 내일까지, "if I lost the receipt, can I return it" / "can I return it
    if I lost the receipt"). One move = the parts between a common prefix and suffix are rotations
    of each other."""
    if q == c or sorted(q) != sorted(c):
        return False
    i = 0
    while q[i] == c[i]:
        i += 1
    j = 0
    while q[len(q) - 1 - j] == c[len(c) - 1 - j]:
        j += 1
    mq, mc = q[i:len(q) - j], c[i:len(c) - j]
    doubled = mq + mq
    return not any(doubled[k:k + len(mc)] == mc for k in range(len(mq)))


_I_SUBJECT = re.compile(r"\bi\b|\bi'(?:m|ve|d|ll)\b|(?<![가-힣])(?:내가|제가|나는|저는)")
_I_OBJECT = re.compile(r"\bme\b|(?<![가-힣])(?:나를|저를|날|나한테|저한테|나에게|저에게|내게|제게)")


def speaker_role_flipped(query: str, candidate: str) -> bool:
    """The speaker does it in one prompt and has it done to them in the other: "can the owner
    remove me" / "can I remove the owner", 관리자가 나를 / 내가 관리자를."""
    def roles(text: str) -> tuple[bool, bool]:
        lowered = text.lower()
        return bool(_I_SUBJECT.search(lowered)), bool(_I_OBJECT.search(lowered))

    (qs, qo), (cs, co) = roles(query), roles(candidate)
    return (qs and not qo and co and not cs) or (qo and not qs and cs and not co)
