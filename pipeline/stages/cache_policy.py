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
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, Field

from pipeline.contracts import RequestDoc

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
    version: str = "cache-v1"
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


def boundary_for(doc: RequestDoc, policy: CachePolicy, domain: str, embedding_revision: str) -> Boundary:
    return Boundary(
        tenant=doc.tenant_id or "",
        acl_scope=doc.context.acl_scope,
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

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_WORD = re.compile(r"[a-z0-9']+|[가-힣]+")
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
    "into", "out", "again", "also", "ok", "okay", "kindly", "possible", "anyone", "someone", "go",
}
_KO_SUFFIXES = sorted([
    "에서는", "으로는", "에게서", "이라도", "입니다", "습니다", "합니다", "해주세요", "해 주세요", "주세요", "할까요",
    "하나요", "인가요", "나요", "가요", "까요", "세요", "어요", "아요", "해요", "이요", "예요", "에요", "에서",
    "으로", "에게", "한테", "까지", "부터", "처럼", "보다", "이랑", "하고", "은", "는", "이", "가", "을", "를",
    "에", "로", "의", "도", "만", "와", "과", "요", "죠", "하는", "하려면", "하려고", "하면", "되나",
    "되나요", "돼요", "되요", "할", "해", "하",
], key=len, reverse=True)
_STOP_KO = {"어떻게", "어떡해", "좀", "제", "저", "나", "내", "혹시", "그", "이거", "저거", "뭐", "무엇", "언제",
            "어디", "왜", "안녕하세요", "감사합니다", "부탁", "부탁드립니다", "방법", "알려", "알려주세요", "궁금",
            "궁금해요", "있나", "있어", "있나요", "있어요", "수", "때", "건가요", "것", "거", "좀요", "하는법", "법",
            "안", "못", "돼", "되", "됨", "하다", "해요", "할"}


def numbers(text: str) -> set[str]:
    return {n.replace(",", "") for n in _NUMBER.findall(text)}


def negated(text: str) -> bool:
    lowered = text.lower()
    words = set(_WORD.findall(lowered))
    return (bool(words & _NEGATION_EN) or "n't" in lowered or bool(re.search(r"\bnon-?[a-z]", lowered))
            or any(k in lowered for k in _NEGATION_KO))


def _ko_stem(word: str) -> str:
    for suffix in _KO_SUFFIXES:
        if word.endswith(suffix) and len(word) > len(suffix):
            return word[: -len(suffix)]
    return word


def _en_stem(word: str) -> str:
    if word.endswith("ss") or word.endswith("us") or word.endswith("is"):
        return word
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


# Korean words ending like this are predicates (verbs/adjectives): rewording, not a different object
# (ambiguous endings such as 면/고/게/어/아/다 are left out: 화면, 창고, 가게, 영어, 바다 are nouns)
_KO_PREDICATE_END = ("요", "나요", "까", "죠", "줘", "돼", "냐", "할", "볼", "해")
_KO_NOUN_PARTICLES = ("은", "는", "이", "가", "을", "를", "에", "에서", "으로", "로", "의", "도", "만", "와", "과", "까지",
                      "부터", "한테", "에게", "처럼", "보다")


def korean_predicates(text: str) -> set[str]:
    """Stems of Korean words that read as predicates (end in a verbal ending, not a noun particle)."""
    out = set()
    for w in re.findall(r"[가-힣]+", text):
        stem = _ko_stem(w)
        if stem == w and len(w) >= 2 and not w.endswith(("하", "되")):
            continue  # a bare word: most likely a noun
        if any(w.endswith(p) and len(w) > len(p) and _ko_stem(w) == w[: -len(p)] for p in _KO_NOUN_PARTICLES):
            continue  # noun + particle (은/는/을 read as particles: a name like 이지은 must stay a noun)
        if w.endswith(_KO_PREDICATE_END) or stem != w:
            out.add(stem)
    return out


def content_words(text: str) -> set[str]:
    out = set()
    for w in _WORD.findall(_PLACEHOLDER.sub(" ", re.sub(r"(?<=\w)-(?=\w)", "", text.lower()))):
        if w.isdigit() or w in _NEGATION_EN:
            continue
        if re.match(r"[가-힣]", w):
            stem = _ko_stem(w)
            if stem and stem not in _STOP_KO and w not in _STOP_KO:
                out.add(stem)
        elif w not in _STOP_EN and len(w) > 1:
            out.add(_en_stem(w.replace("'", "")))
    return out


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
    "coming", "upcoming", "early", "late", "earlier", "later",
}
_SPECIFIC_KO = {"켜", "끄", "꺼", "추가", "삭제", "포함", "별도", "제외", "오전", "오후", "어제", "오늘", "내일", "주말", "평일",
                "열", "닫", "시작", "중지", "해지", "가입", "올리", "내리", "좋", "나쁘", "피하", "피해", "좋은", "나쁜"}
# Paraphrase lexicon: words that name the same thing (tuned on tests/data/cache_pairs.jsonl; see README).
_SYNONYMS = [
    {"ship", "deliver", "delivery", "shipping", "send"}, {"reset", "recover", "change"},
    {"password", "passcode", "pw"}, {"app", "application"}, {"buy", "purchase"}, {"price", "cost"},
    {"refund", "reimburse", "money back"}, {"cancel", "cancellation"}, {"sign", "register", "signup"},
    {"login", "log", "signin"}, {"phone", "mobile", "cell"}, {"store", "shop"}, {"item", "product"},
    {"symptom", "sign"}, {"cause", "why"}, {"fee", "charge", "cost"}, {"long", "duration"},
    {"비밀번호", "비번", "패스워드"}, {"재설정", "초기화", "변경", "바꾸"}, {"배송", "택배", "배달"},
    {"앱", "어플", "애플리케이션"}, {"환불", "돈"}, {"취소", "캔슬"}, {"가입", "등록"}, {"제품", "상품", "물건"},
    {"구매", "구입", "사"}, {"가격", "비용", "요금"}, {"판매", "팔"}, {"연결", "페어링"}, {"출력", "인쇄", "프린트"},
    {"교환", "바꿔"}, {"신청", "접수"}, {"방법", "어떻게"},
]
_SYN_INDEX = {w: i for i, group in enumerate(_SYNONYMS) for w in group}


def _same_word(a: str, b: str) -> bool:
    if a == b:
        return True
    ga, gb = _SYN_INDEX.get(a), _SYN_INDEX.get(b)
    if ga is not None and ga == gb:
        return True
    # morphological variants: deliver/delivery, 화면녹화/녹화 (one contains the other, long enough)
    short, long_ = sorted((a, b), key=len)
    hangul = bool(re.match(r"[가-힣]", short))
    return len(short) >= (2 if hangul else 4) and long_.startswith(short) and len(long_) - len(short) <= 3


@dataclass
class GateVerdict:
    passed: bool
    checks: dict[str, bool] = field(default_factory=dict)
    reason: str = ""
    unmatched: list[str] = field(default_factory=list)


def _unmatched(words: list[str], other: set[str], other_compact: str) -> list[str]:
    out = []
    for w in words:
        if any(_same_word(w, o) for o in other):
            continue
        if re.match(r"[가-힣]", w) and len(w) >= 2 and w in other_compact:
            continue  # Korean spacing: 학생 할인 vs 학생할인
        out.append(w)
    return out


def gate(query: str, candidate: str, word_similarity, word_match: float) -> GateVerdict:
    """Do query and cached prompt ask the same thing?

    Numbers, masked entities and negation must agree. Content words: a word only one side has is
    an added detail or a rewording; words *both* sides lack in the other are a substitution
    ("reset my password" / "reset my router") and fail, unless they are known synonyms, or
    English words whose embeddings are close (`word_similarity` >= word_match) and that do not
    pin down a specific day, action or direction. Korean substitutions never pass on similarity:
    the English embedding model does not separate Korean nouns."""
    checks = {
        "numbers": numbers(query) == numbers(candidate),
        "entities": set(_PLACEHOLDER.findall(query)) == set(_PLACEHOLDER.findall(candidate)),
        "negation": negated(query) == negated(candidate),
    }
    qw, cw = content_words(query), content_words(candidate)
    q_compact = re.sub(r"\s+", "", query.lower())
    c_compact = re.sub(r"\s+", "", candidate.lower())
    q_only = _unmatched(sorted(qw - cw), cw, c_compact)
    c_only = _unmatched(sorted(cw - qw), qw, q_compact)
    unmatched: list[str] = []
    # capitalised mid-sentence words name things (Tylenol, Toronto): never matched by similarity
    proper = {_en_stem(w.lower()) for w in re.findall(r"(?<=[a-z,] )[A-Z][a-zA-Z]+", query + " . " + candidate)}
    # Korean predicates that differ are rewording (봐요/볼 수 있나요); specific ones still count
    preds = korean_predicates(query) | korean_predicates(candidate)
    q_only = [w for w in q_only if w not in preds or w in _SPECIFIC_KO]
    c_only = [w for w in c_only if w not in preds or w in _SPECIFIC_KO]
    if q_only and c_only:  # a substitution: each side names something the other does not
        for side, other in ((q_only, c_only), (c_only, q_only)):
            english = [w for w in side if not re.match(r"[가-힣]", w) and w not in _SPECIFIC and w not in proper]
            blocked = [w for w in side if w not in english]
            close = word_similarity(english, [o for o in other if not re.match(r"[가-힣]", o)]) if english else []
            unmatched += blocked + [w for w, s in zip(english, close) if s < word_match]
    elif len(q_only) + len(c_only) > 2:
        unmatched = q_only + c_only  # too much added detail to be the same question
    else:
        unmatched = [w for w in q_only + c_only if w in _SPECIFIC]
    checks["content_words"] = not unmatched
    failed = [k for k, ok in checks.items() if not ok]
    return GateVerdict(passed=not failed, checks=checks, reason=("gate_failed:" + ",".join(failed)) if failed else "gate_passed",
                       unmatched=unmatched)
