"""The semantic cache's policy as pure functions: boundaries, bypass rules, thresholds and the
verification gate. No index, no model, no Kafka: every decision here is replayable.

A hit needs all of: the same boundaries (filtered in the index, so a cross-boundary hit is
impossible by construction), similarity >= the domain's threshold, a fresh entry, and the gate:
cosine alone scores "reset my password" vs "reset my router" at 0.50 while some paraphrases
score 0.50-0.62, so the gate checks that numbers, masked entities, negation and content words
agree before an answer is reused.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, Field

from pipeline.contracts import RequestDoc
from pipeline.engines.text_analyzer import Analysis, Token

Mode = Literal["on", "shadow", "off"]


class DomainRule(BaseModel):
    threshold: float | None = Field(0.85, description="None: never cached")
    ttl_s: int = 86_400
    keywords: list[str] = Field(default_factory=list, description="lower-case words that select this domain")


def _default_domains() -> dict[str, DomainRule]:
    return {
        "faq": DomainRule(threshold=0.50, ttl_s=7 * 86_400),
        "tech": DomainRule(threshold=0.50, ttl_s=3 * 86_400,
                           keywords=["install", "update", "error", "app", "wifi", "bluetooth", "설치", "업데이트", "오류", "앱"]),
        "shipping": DomainRule(threshold=0.55, ttl_s=86_400,
                               keywords=["ship", "shipping", "delivery", "deliver", "return", "배송", "반품", "택배"]),
        "account": DomainRule(threshold=0.55, ttl_s=86_400,
                              keywords=["password", "login", "log in", "account", "profile", "비밀번호", "로그인", "계정"]),
        # strict: the gate plus a high threshold; set threshold: null to never cache a domain
        "payments": DomainRule(threshold=0.60, ttl_s=86_400, keywords=["refund", "charge", "charged", "card", "payment", "invoice",
                                                          "환불", "결제", "카드", "청구"]),
        "medical": DomainRule(threshold=0.60, ttl_s=86_400, keywords=["symptom", "dose", "dosage", "medicine", "doctor", "pain",
                                                         "증상", "복용", "약", "병원", "통증"]),
    }


class CachePolicy(BaseModel):
    version: str = "cache-v2"
    mode: Mode = "on"
    tenant_modes: dict[str, Mode] = Field(default_factory=dict)
    domain_modes: dict[str, Mode] = Field(default_factory=dict)
    default_domain: str = "faq"
    domains: dict[str, DomainRule] = Field(default_factory=_default_domains)
    # model name -> revision, prompt template revision: the cache boundary for "which model answered"
    model_revisions: dict[str, str] = Field(default_factory=lambda: {"default": "default@r1"})
    prompt_revision: str = "prompt@r1"
    # live data the answer would go stale on: requests mentioning these bypass the cache
    volatile_keywords: list[str] = Field(default_factory=lambda: [
        "balance", "my order", "where is my", "status of my", "tracking", "today's", "right now", "current",
        "잔액", "잔고", "배송 조회", "배송조회", "주문 상태", "지금", "오늘"])
    # masked PII means the answer is about a person: personal, never shared
    cache_masked_entities: bool = False
    top_k: int = 5
    word_match: float = Field(0.8, description="cosine at which an unmatched English word counts as paraphrased")
    # the gate's vocabulary, on top of the built-in lists (a deployment's own products and jargon)
    gate_synonyms: list[list[str]] = Field(default_factory=list, description="extra groups of words that mean the same")
    gate_specific_words: list[str] = Field(default_factory=list, description="extra words that must agree exactly")
    gate_added_words_max: int = Field(2, ge=0, description="generic words one side may add")
    gate_generic_zipf: float = Field(4.5, description="wordfreq Zipf at or above which an added word is generic")
    # all-MiniLM-L6-v2 is English-only: Korean paraphrases score 0.2-0.6, so Korean prompts pick
    # candidates at a lower threshold; the gate, not the cosine, decides the hit
    hangul_threshold_offset: float = Field(0.3, ge=0.0, le=1.0)

    def threshold_for(self, domain: str, text: str) -> float | None:
        rule = self.domains.get(domain)
        if rule is None or rule.threshold is None:
            return None
        if len(re.findall(r"[가-힣]", text)) > len(re.findall(r"[A-Za-z]", text)):
            return max(0.0, rule.threshold - self.hangul_threshold_offset)
        return rule.threshold

    def mode_for(self, tenant: str | None, domain: str) -> Mode:
        return self.domain_modes.get(domain) or self.tenant_modes.get(tenant or "") or self.mode

    def model_revision(self, model: str | None) -> str:
        return self.model_revisions.get(model or "default") or self.model_revisions.get("default", "unknown")


# ---- boundaries ------------------------------------------------------------------------------

BOUNDARY_FIELDS = ("tenant", "acl_scope", "model_revision", "prompt_revision", "data_version", "locale",
                   "embedding_revision", "domain")


@dataclass(frozen=True)
class Boundary:
    tenant: str
    acl_scope: str
    model_revision: str
    prompt_revision: str
    data_version: str
    locale: str
    embedding_revision: str
    domain: str

    def as_payload(self) -> dict[str, str]:
        return {f: getattr(self, f) for f in BOUNDARY_FIELDS}


def cache_text(doc: RequestDoc) -> str:
    """What the cache compares: the (masked) user turns; system prompts are part of the prompt revision."""
    return "\n".join(m.content for m in doc.body.messages if m.role == "user").strip()


def detect_domain(doc: RequestDoc, policy: CachePolicy) -> str:
    if doc.context.domain:
        return doc.context.domain
    text = cache_text(doc).lower()
    for name, rule in policy.domains.items():
        if any(k in text for k in rule.keywords):
            return name
    return policy.default_domain


def prompt_revision(doc: RequestDoc, policy: CachePolicy) -> str:
    """The policy's prompt revision, plus a digest of the request's system prompt when it has one:
    the same question under another system prompt is another question."""
    system = "\n".join(m.content for m in doc.body.messages if m.role == "system")
    if not system:
        return policy.prompt_revision
    return f"{policy.prompt_revision}+sys:{hashlib.sha256(system.encode()).hexdigest()[:16]}"


def acl_scope(doc: RequestDoc) -> str | None:
    """The scope an entry is shared in, from who the caller *is* (principal and roles, set by mask
    from the API key), never from what it claims: `context.acl_scope` only picks among the scopes the
    caller holds. `user` or `user:<anyone>` is the caller's own principal; `role:<r>` and
    `group:<r>` need r among the caller's roles. None: a scope the caller does not hold."""
    declared = doc.context.acl_scope.strip()
    kind, _, name = declared.partition(":")
    if kind == "tenant" and not name:
        return "tenant"
    if kind == "user":
        return f"user:{doc.principal}" if doc.principal else None
    if kind in ("role", "group") and name and name in doc.roles:
        return f"role:{name}"
    return None


def boundary_for(doc: RequestDoc, policy: CachePolicy, domain: str, embedding_revision: str) -> Boundary:
    return Boundary(
        tenant=doc.tenant_id or "",
        acl_scope=acl_scope(doc) or "",
        model_revision=policy.model_revision(doc.body.model),
        prompt_revision=prompt_revision(doc, policy),
        data_version=doc.context.data_version or "",
        locale=doc.context.locale,
        embedding_revision=embedding_revision,
        domain=domain,
    )


_PLACEHOLDER = re.compile(r"<[A-Z_]+_\d+>")


def bypass_reason(doc: RequestDoc, policy: CachePolicy, domain: str) -> str | None:
    """Why this request may neither be served from nor written to the cache (None: it may)."""
    ctx = doc.context
    if doc.rollout is not None:
        return "rollout"  # RL wants fresh samples from the actor, never a stored answer
    if acl_scope(doc) is None:
        return "acl_scope_not_held"  # neither read nor write another principal's or role's entries
    if ctx.personalised:
        return "personalised"
    if ctx.tool_side_effects:
        return "tool_side_effects"
    if ctx.volatile:
        return "volatile_data"
    text = cache_text(doc)
    if not text:
        return "no_user_text"
    if len(doc.body.messages) > 2 or any(m.role == "assistant" for m in doc.body.messages):
        return "conversation_context"  # earlier turns change the meaning of the last one
    if doc.body.images:
        return "images"
    if doc.body.output_schema() is not None:
        return "structured_output"  # the answer's shape depends on the schema, which no entry records
    if not policy.cache_masked_entities and _PLACEHOLDER.search(text):
        return "personal_entities"
    rule = policy.domains.get(domain)
    if rule is None or rule.threshold is None:
        return f"domain_not_cached:{domain}"
    lowered = text.lower()
    if any(k in lowered for k in policy.volatile_keywords):
        return "volatile_keyword"
    if doc.body.temperature is not None and doc.body.temperature > 0 and doc.body.seed is None:
        return None  # sampling is fine: a cached answer is one valid sample
    return None


# ---- the verification gate -------------------------------------------------------------------
#
# The gate compares the *words* of two prompts, by kind, from a morphological analysis (Kiwi for
# Korean, spaCy for English: `engines/text_analyzer.py`). Every content word on one side must be
# accounted for on the other: the same lemma, a known synonym, a morphological variant, or part of
# a compound. What is left over decides:
# - slots (nouns, names, adjectives, determiners) left over on *both* sides: a substitution, a
#   different thing asked about -> fail ("reset my password" / "reset my router");
# - verbs left over on both sides: a different action -> fail (cancel / change my order);
#   English common nouns and verbs may pass on word-embedding similarity >= `word_match`;
# - a slot left over on one side while the other side has only a stray verb in its place: the
#   tagger called a noun a verb (bio) -> fail;
# - slots on one side only: added detail, allowed when it is at most `added_words_max` generic
#   (frequent) words and no name ("the latest version of the app" vs "on the router");
# - a verb or adverb on one side only is rewording, unless it pins down a day, a time or a
#   direction (`_SPECIFIC`, + policy words): enable/disable, today/tomorrow must agree wherever they appear.
# Numbers (digits and number words), masked entities and negation must agree exactly.

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_NEGATION_EN = {"not", "no", "never", "without", "cannot", "can't", "won't", "don't", "doesn't", "didn't",
                "isn't", "aren't", "wasn't", "shouldn't", "couldn't", "wouldn't", "exclude", "excluding", "except",
                "neither", "nor", "unable", "fail", "failed", "fails"}
_NEGATION_KO = ("안 ", "못 ", "않", "없", "말고", "제외", "아니", "불가", "실패", "안돼", "안되", "안 돼", "못해")
_STOP_EN = {
    "a", "an", "the", "i", "me", "my", "mine", "you", "your", "we", "our", "us", "it", "its", "is", "are", "was",
    "were", "be", "been", "am", "do", "does", "did", "to", "of", "in", "on", "at", "for", "with", "and", "or", "so",
    "how", "what", "when", "where", "why", "which", "who", "can", "could", "would", "should", "will", "shall",
    "may", "might", "must", "please", "pls", "plz", "hi", "hello", "hey", "thanks", "thank", "there", "this",
    "that", "these", "those", "if", "get", "got", "need", "want", "like", "just", "some", "any", "there's",
    "i'm", "i've", "it's", "what's", "how's", "let", "know", "tell", "help", "way", "about", "from", "by", "up",
    "into", "out", "again", "also", "ok", "okay", "kindly", "possible", "anyone", "someone", "go", "have", "has",
    "make", "able", "really", "anymore", "still", "already", "even", "exactly", "actually", "yes",
}
_STOP_KO = {"어떻게", "어떡해", "좀", "제", "저", "나", "내", "혹시", "그", "이거", "저거", "뭐", "무엇", "언제",
            "어디", "왜", "안녕하세요", "감사합니다", "부탁", "부탁드립니다", "방법", "알려", "알려주세요", "궁금",
            "수", "때", "것", "거", "법", "하", "되", "있", "없", "가능", "필요", "싶", "주", "보", "알", "어떻",
            "이렇", "그렇", "어떤", "뭐뭐", "얼마나", "얼마", "이", "데", "줄", "뿐", "듯", "만큼",
            "번", "개", "원", "적", "채", "중", "등", "분", "쪽", "편", "해", "드리", "받", "알리", "주시"}

# Multi-word expressions that are one word to the gate: "turn on" is "enable" (normalised before
# analysis, so "turn on dark mode" and "enable dark mode" compare as the same verb).
_PHRASES = [
    (r"\bturn(?:s|ed|ing)? on\b", "enable"), (r"\bturn(?:s|ed|ing)? off\b", "disable"),
    (r"\bswitch(?:es|ed|ing)? on\b", "enable"), (r"\bswitch(?:es|ed|ing)? off\b", "disable"),
    (r"\bsign(?:s|ed|ing)? ?up\b", "register"), (r"\bsign(?:s|ed|ing)? ?in\b", "login"),
    (r"\blog(?:s|ged|ging)? ?in(?:to)?\b", "login"), (r"\bsign(?:s|ed|ing)? ?out\b", "logout"),
    (r"\blog(?:s|ged|ging)? ?(?:me )?out\b", "logout"), (r"\bwork(?:s|ed|ing)? out\b", "exercise"),
    (r"\bpick(?:s|ed|ing)? ?up\b", "collect"), (r"\bp\.?o\.? box", "pobox"), (r"\bset ?up\b", "setup"),
    (r"\bin-?store\b", "store"),
]
_KO_NATIVE = {"한": 1, "두": 2, "세": 3, "네": 4, "다섯": 5}
_EN_NUMBER = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10,
              "twice": 2, "double": 2, "dozen": 12}
_KO_UNIT = {"십": 10, "백": 100, "천": 1_000, "만": 10_000, "억": 100_000_000}


def numbers(text: str) -> set[str]:
    """Quantities as digits: "5만원" = "50,000원", "two cards" = "2 cards", "두 번" = "2번"."""
    text = re.sub(r"(\d+(?:[.,]\d+)*)\s*(십|백|천|만|억)",
                  lambda m: str(int(float(m.group(1).replace(",", "")) * _KO_UNIT[m.group(2)])), text)
    text = re.sub(r"(?<![가-힣])(한|두|세|네|다섯) ?(?=(?:번|개|장|명|달|시간|사람|가지|권|병|잔|대|살)(?![가-힣]{2}))",
                  lambda m: str(_KO_NATIVE[m.group(1)]), text)
    text = re.sub(r"\b(" + "|".join(_EN_NUMBER) + r")\b", lambda m: str(_EN_NUMBER[m.group(1).lower()]), text,
                  flags=re.IGNORECASE)
    return {n.replace(",", "") for n in _NUMBER.findall(text)}


def negated(text: str, analysis: Analysis | None = None) -> bool:
    lowered = text.lower()
    words = set(re.findall(r"[a-z']+", lowered))
    return (bool(words & _NEGATION_EN) or "n't" in lowered or bool(re.search(r"\bnon-?[a-z]", lowered))
            or any(k in lowered for k in _NEGATION_KO)
            or (analysis is not None and any(t.kind == "neg" for t in analysis.tokens)))


def normalise(text: str) -> str:
    """What the analyser sees: placeholders out (compared on their own), hyphenated words joined,
    multi-word expressions as one word."""
    text = re.sub(r"(?<=\w)-(?=\w)", "", _PLACEHOLDER.sub(" ", text))
    for pattern, word in _PHRASES:
        text = re.sub(pattern, word, text, flags=re.IGNORECASE)
    return text


# Words that pin down *which* thing is meant: they must match exactly, never by similarity.
_SPECIFIC = {
    "monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday", "weekend", "weekday",
    "january", "february", "march", "april", "june", "july", "august", "september", "october", "november",
    "december", "today", "tomorrow", "yesterday", "tonight", "morning", "afternoon", "evening", "night", "am", "pm",
    "week", "month", "year", "daily", "weekly", "monthly", "yearly", "annual",
    "enable", "disable", "include", "exclude", "add", "remove", "delete", "open", "close", "start", "stop",
    "upgrade", "downgrade", "buy", "sell", "import", "export", "upload", "download", "before", "after",
    "good", "bad", "best", "worst", "avoid", "safe", "unsafe", "email", "mail", "mailing", "postal", "billing",
    "shipping", "home", "work", "business", "personal", "first", "last", "new", "old", "next", "previous",
    "coming", "upcoming", "early", "late", "earlier", "later", "install", "uninstall", "login", "logout",
    "lock", "unlock", "send", "receive", "increase", "decrease", "raise", "lower", "more", "less",
    # tiers and options: the same question about another product or service level
    "express", "standard", "economy", "priority", "overnight", "international", "domestic", "free", "paid",
    "premium", "basic", "pro", "plus", "lite", "family", "student", "trial", "gold", "silver",
}
_SPECIFIC_KO = {"켜", "끄", "꺼", "추가", "삭제", "포함", "별도", "제외", "오전", "오후", "어제", "오늘", "내일", "주말", "평일",
                "열", "닫", "시작", "중지", "해지", "가입", "올리", "내리", "좋", "나쁘", "피하", "피해", "좋은", "나쁜",
                "설치", "로그인", "로그아웃", "보내", "늘리", "줄이", "이번", "다음", "지난",
                "특급", "빠른배송", "일반배송", "해외", "국내", "무료", "유료", "프리미엄", "베이직", "프로", "플러스",
                "패밀리", "학생", "체험"}
# Paraphrase lexicon: words that name the same thing (grown on tests/data/cache_pairs.jsonl: see README).
_SYNONYMS = [
    {"ship", "deliver", "delivery", "shipping", "send"}, {"reset", "recover", "change"},
    {"password", "passcode", "pw"}, {"app", "application"}, {"buy", "purchase"}, {"price", "cost"},
    {"refund", "reimburse", "money back"}, {"cancel", "cancellation", "stop", "terminate"},
    {"register", "signup", "subscribe", "enroll"}, {"login", "log", "signin"}, {"phone", "mobile", "cell"},
    {"store", "shop"}, {"item", "product", "something", "thing"}, {"symptom", "sign"}, {"cause", "reason"},
    {"fee", "charge", "cost", "much"}, {"long", "duration", "time"}, {"change", "update", "edit", "modify", "switch", "set"},
    {"package", "parcel"}, {"history", "record", "log"}, {"safe", "secure"}, {"website", "site"},
    {"picture", "photo", "image"}, {"hour", "time"}, {"copy", "download", "export"}, {"teen", "teenager", "adolescent"},
    {"often", "frequently"}, {"fast", "quickly", "quick"}, {"human", "person", "agent", "representative"},
    {"talk", "speak", "chat"}, {"contact", "reach"}, {"find", "locate", "check", "see", "view", "look"},
    {"top", "first"}, {"pair", "connect"}, {"offer", "sell", "provide", "have"}, {"show", "display", "read"},
    {"common", "typical", "usual"}, {"signature", "sign"}, {"auto", "automatic"}, {"arrive", "come"},
    {"lower", "reduce", "decrease", "cut"}, {"raise", "increase"}, {"forget", "lose"}, {"apply", "enter", "use"},
    {"drain", "die"},
    {"비밀번호", "비번", "패스워드"}, {"재설정", "초기화", "변경", "바꾸"}, {"배송", "택배", "배달"},
    {"앱", "어플", "애플리케이션"}, {"환불", "돈"}, {"취소", "캔슬", "해지"}, {"가입", "등록", "신청", "구독"}, {"제품", "상품", "물건"},
    {"구매", "구입", "사"}, {"가격", "비용", "요금"}, {"판매", "팔"}, {"연결", "페어링"}, {"출력", "인쇄", "프린트"},
    {"교환", "바꿔"}, {"신청", "접수"}, {"방법", "어떻게"}, {"휴대폰", "폰", "핸드폰", "휴대전화"}, {"기록", "내역"},
    {"리뷰", "후기"}, {"공복", "빈속"}, {"회원", "멤버십"}, {"삭제", "지우"}, {"사인", "서명"}, {"커서", "포인터"},
    {"수정", "변경", "바꾸"}, {"발급", "발행"}, {"스크린샷", "캡처", "화면캡처"}, {"모든", "전체", "전부"},
    {"카톡", "카카오톡"}, {"잊어버리", "까먹", "잊"}, {"확인", "보", "조회"}, {"대화", "채팅"}, {"성인", "어른"}, {"원인", "이유"}, {"일반", "기본", "보통"},
    {"작성", "남기"}, {"송장", "운송장"}, {"다운로드", "내려받"}, {"저장공간", "용량", "저장용량"},
]
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
        for i, group in enumerate([*_SYNONYMS, *policy.gate_synonyms]):
            for w in group:
                index.setdefault(w.lower(), set()).add(i)
        return cls(word_match=policy.word_match, added_words_max=policy.gate_added_words_max,
                   generic_zipf=policy.gate_generic_zipf, synonyms={w: frozenset(g) for w, g in index.items()},
                   specific=frozenset(w.lower() for w in policy.gate_specific_words) | _SPECIFIC | _SPECIFIC_KO)

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
        if t.kind not in _CONTENT or t.surface in _NEGATION_EN:
            continue
        if re.match(r"[가-힣]", t.lemma):
            if t.lemma in _STOP_KO:
                continue
        elif t.lemma in _STOP_EN or t.surface in _STOP_EN or len(t.lemma) < 2:
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


def gate(query: str, candidate: str, analyze: Callable[[str], Analysis], word_similarity,
         rules: GateRules) -> GateVerdict:
    """Do query and cached prompt ask the same thing? (the rules are above)

    `word_similarity(words, against)` lets close English common nouns count as the same word
    (>= rules.word_match); names, adjectives and Korean words never pass on similarity: co-hyponyms
    (Canada/Mexico, 부산/대전) embed close together."""
    qa, ca = analyze(normalise(query)), analyze(normalise(candidate))
    checks = {
        "numbers": numbers(query) == numbers(candidate),
        "entities": set(_PLACEHOLDER.findall(query)) == set(_PLACEHOLDER.findall(candidate)),
        "negation": negated(query, qa) == negated(candidate, ca),
    }
    qt, ct = content_tokens(qa), content_tokens(ca)
    q_un = _unmatched(qt, ct, re.sub(r"\s+", "", candidate.lower()), rules)
    c_un = _unmatched(ct, qt, re.sub(r"\s+", "", query.lower()), rules)
    bad = [t.lemma for t in q_un + c_un if _specific(t, rules.specific)]
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
    checks["content_words"] = not bad
    failed = [k for k, ok in checks.items() if not ok]
    return GateVerdict(passed=not failed, checks=checks, reason=("gate_failed:" + ",".join(failed)) if failed else "gate_passed",
                       unmatched=sorted(set(bad)))
