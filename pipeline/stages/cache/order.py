"""Which word plays which role: the gate's order-sensitive checks. Two prompts with the same words
can ask opposite things when two of them trade places ("from savings to checking" / "from checking
to savings", 포인트로 상품권 / 상품권으로 포인트); moving one clause does not change the question.

Markers: in English the word before a word (past determiners), in Korean the particle on its 어절.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from pipeline.engines.text_analyzer import Analysis, Token
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


def pairing(q: list[str], c: list[str], same: Callable[[str, str], bool]) -> dict[int, int]:
    """The most words of `q` paired each with its own word of `c` (bipartite matching): index in
    `c` -> index in `q`."""
    owner: dict[int, int] = {}

    def place(i: int, seen: set[int]) -> bool:
        for j in sorted(range(len(c)), key=lambda j: (c[j] != q[i], abs(j - i))):  # the same word, nearby, first
            if j not in seen and same(q[i], c[j]):
                seen.add(j)
                if j not in owner or place(owner[j], seen):
                    owner[j] = i
                    return True
        return False

    for i in range(len(q)):
        place(i, set())
    return owner


def _in_order(q: list[str], c: list[str], same: Callable[[str, str], bool]) -> int:
    """How many shared words line up in the same order (longest common subsequence)."""
    row = [0] * (len(c) + 1)
    for a in q:
        prev = 0
        for j, b in enumerate(c, start=1):
            prev, row[j] = row[j], (prev + 1 if same(a, b) else max(row[j], row[j - 1]))
    return row[-1]


def out_of_order(q: list[str], c: list[str], same: Callable[[str, str], bool]) -> bool:
    """Some content words both prompts share cannot be lined up in one order: two of them traded
    places or one moved past another ("one email ... multiple accounts" / "one account ...
    multiple emails", 폰 화면을 TV로 / TV 화면을 폰으로)."""
    return _in_order(q, c, same) < len(pairing(q, c, same))


# Where a clause begins or ends, and what role it plays. English subordinate clauses start with
# their conjunction; Korean ones end with a connective ending on their last word.
_SUBORDINATE_EN = {"if": "cond", "when": "cond", "whenever": "cond", "once": "cond", "unless": "cond",
                   "because": "cause", "since": "cause"}
_SUBORDINATE_KO = (("면", "cond"), ("는데", "ctx"), ("은데", "ctx"), ("니까", "cause"), ("어서", "cause"),
                   ("아서", "cause"), ("해서", "cause"), ("지만", "ctx"))
_BREAK = re.compile(r"[,;.!?\n]+|\s+(?=(?:" + "|".join(_SUBORDINATE_EN) + r")\b)", re.IGNORECASE)


def typed_clauses(text: str) -> list[tuple[str, int, int]]:
    """The clauses of `text` as (role, start, end), role one of cond(ition), cause, ctx, main. "Can
    I return it if I lost the receipt" -> main "Can I return it", cond "if I lost the receipt";
    탈퇴하면 앱도 삭제돼요 -> cond 탈퇴하면, main 앱도 삭제돼요."""
    bounds, pos = [], 0
    for m in _BREAK.finditer(text):
        bounds.append((pos, m.start()))
        pos = m.end()
    bounds.append((pos, len(text)))
    out: list[tuple[str, int, int]] = []
    for lo, hi in bounds:
        words = [(lo + w.start(), lo + w.end(), w.group()) for w in re.finditer(r"\S+", text[lo:hi])]
        if not words:
            continue
        first = re.sub(r"\W", "", words[0][2].lower())
        if first in _SUBORDINATE_EN:
            out.append((_SUBORDINATE_EN[first], words[0][0], words[-1][1]))
            continue
        start = words[0][0]
        for i, (_, end, w) in enumerate(words):  # a Korean connective ending closes its clause
            role = next((r for ending, r in _SUBORDINATE_KO if re.fullmatch(r"[가-힣]+" + ending, w)), None)
            if role:
                out.append((role, start, end))
                start = words[i + 1][0] if i + 1 < len(words) else end
        if start < words[-1][1]:
            out.append(("main", start, words[-1][1]))
    return out


def _role_at(clauses: list[tuple[str, int, int]], pos: int) -> str:
    return next((role for role, lo, hi in clauses if lo <= pos < hi), "")


# Words that head a phrase or clause which may stand anywhere in an English sentence without
# changing its roles: "On Windows 11, how do I ..." / "How do I ... on Windows 11"
_MOVABLE_EN = frozenset({"on", "in", "at", "for", "with", "without", "to", "from", "by", "via", "into", "onto", "over",
                         "under", "near", "within", "during", "throughout", "after", "before", "until", "since",
                         "if", "when", "whenever", "once", "while", "because", "unless", "using"})
_TIED_KO = frozenset({"", "의"})  # no particle, or the genitive: the word leans on the next one


def _rotation(seq: list[int]) -> tuple[list[int], list[int]] | None:
    """`seq` (positions in one prompt, listed in the other prompt's order) is the sorted order with
    one stretch moved: the two parts that traded places, else None."""
    want = sorted(seq)
    i = 0
    while i < len(seq) and seq[i] == want[i]:
        i += 1
    j = len(seq)
    while j > i and seq[j - 1] == want[j - 1]:
        j -= 1
    mq, mc = want[i:j], seq[i:j]
    for k in range(1, len(mq)):
        if mq[k:] + mq[:k] == mc:
            return mq[:k], mq[k:]
    return None


def _marker_en(text: str, t: Token) -> str:
    """The word that heads `t`'s phrase: the word before it, past determiners ("on the mobile app"
    -> on), or the word itself when it heads one ("using a Mac")."""
    if t.surface in _MOVABLE_EN:
        return t.surface
    before = [w for w in re.findall(r"[a-z0-9']+", text[:t.start].lower()) if w not in _DETERMINERS]
    return before[-1] if before else "^"


def _ending_ko(text: str, t: Token) -> str:
    """What follows `t` in its 어절: the particle or ending (부산으로 -> 으로)."""
    m = re.match(r"[가-힣]*", text[t.start + len(t.surface):])
    return m.group() if m else ""


_TOWARD = ({"to", "into", "onto", "toward", "towards"}, {"로", "으로", "에게", "한테", "께"})
_AWAY = ({"from"}, {"에서", "에게서", "한테서", "부터", "에서부터"})


def direction_flipped(query: str, candidate: str, q: list[Token], c: list[Token],
                      same: Callable[[str, str], bool]) -> bool:
    """A shared word is where a thing goes on one side and where it comes from on the other: "ship
    to a P.O. box" / "ship from a P.O. box", 서울로 / 서울에서. Arguments as for phrase_moved."""
    def side(text: str, t: Token) -> int:
        korean = bool(re.match(r"[가-힣]", t.surface))
        mark = _ending_ko(text, t) if korean else _marker_en(text, t)
        return 1 if mark in _TOWARD[korean] else -1 if mark in _AWAY[korean] else 0

    for j, i in pairing([t.lemma for t in q], [t.lemma for t in c], same).items():
        if side(query, q[i]) * side(candidate, c[j]) < 0:
            return True
    return False


def phrase_moved(query: str, candidate: str, q: list[Token], c: list[Token], same: Callable[[str, str], bool]) -> bool:
    """The shared words differ in order only by one stretch moved elsewhere in its clause, or with
    its clause, and that stretch is marked alike on both sides, so it keeps its role: headed by the
    same preposition or conjunction in English, ending in the same particle in Korean (Korean marks
    roles on the word: 삼성페이로 편의점에서 / 편의점에서 삼성페이로 is one question; not 카카오로
    가입했는데 이메일로 로그인 / 이메일로 가입했는데 카카오로 로그인, where 카카오로 changed clause).
    `query`, `candidate`: the analysed texts, lower-cased; `q`, `c`: their content words."""
    paired = pairing([t.lemma for t in q], [t.lemma for t in c], same)
    rotation = _rotation([paired[j] for j in sorted(paired)])
    if rotation is None:
        return False
    partner = {i: j for j, i in paired.items()}
    qc, cc = typed_clauses(query), typed_clauses(candidate)
    if any(_role_at(qc, q[i].start) != _role_at(cc, c[j].start) for i, j in partner.items()):
        return False  # a word changed clause: it plays another part now
    korean = bool(re.search(r"[가-힣]", query))
    for block in rotation:
        if korean:
            ends = (_ending_ko(query, q[block[-1]]), _ending_ko(candidate, c[partner[block[-1]]]))
            if ends[0] == ends[1] and ends[0] not in _TIED_KO:
                return True
        else:
            marks = (_marker_en(query, q[block[0]]), _marker_en(candidate, c[partner[block[0]]]))
            if marks[0] == marks[1] and marks[0] in _MOVABLE_EN:
                return True
            # "the price of express shipping" / "express shipping cost": a head noun before "of" on
            # one side stands after what it is of, as a compound, on the other
            ofs = (_next_en(query, q[block[-1]]) == "of", _next_en(candidate, c[partner[block[-1]]]) == "of")
            if ofs[0] != ofs[1] and len(block) == 1 and q[block[0]].kind == "noun":
                return True
    return False


def _next_en(text: str, t: Token) -> str:
    after = re.findall(r"[a-z0-9']+", text[t.start + len(t.surface):].lower())
    return after[0] if after else "$"


_KEYWORD_GLUE = frozenset({"how", "what", "where", "when", "why", "which", "to"})


def telegraphic(text: str, surfaces: set[str]) -> bool:
    """A keyword query: every word is a content word (`surfaces`), a number or a question word
    ("windows 11 screenshot how", 탈수 초기 증상). It marks no roles, so its order says nothing."""
    words = re.findall(r"[a-z0-9'가-힣]+", text.lower())
    return len(words) >= 2 and all(w in surfaces or w.isdigit() or w in _KEYWORD_GLUE for w in words)
