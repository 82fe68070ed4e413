"""The semantic cache's policy as pure functions: boundaries, bypass rules and thresholds (the
verification gate is gate.py, its word lists lexicon.py). No index, no model, no Kafka: every
decision here is replayable.

A hit needs all of: the same boundaries (filtered in the index, so a cross-boundary hit is
impossible by construction), similarity >= the domain's threshold, a fresh entry, and the gate:
cosine alone scores "reset my password" vs "reset my router" at 0.50 while some paraphrases
score 0.50-0.62, so the gate checks that numbers, masked entities, negation and content words
agree before an answer is reused.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from pydantic import BaseModel, Field

from pipeline.contracts import RequestDoc
from pipeline.stages.cache.lexicon import ALTERNATIVE, NEGATION_COUNT, NEGATION_EN, NEGATION_KO

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
    # live data the answer would go stale on: requests mentioning these bypass the cache (a bypass is
    # always safe, a stale hit is not). Plain English words match as whole words ("now" is not in
    # "know"); anything else as a lower-case substring. Grouped by what goes stale.
    volatile_keywords: list[str] = Field(default_factory=lambda: [
        # time words that anchor the question to the moment it is asked
        "today", "today's", "tonight", "this morning", "this afternoon", "this evening", "right now", "now",
        "currently", "current", "at the moment", "at this moment", "as of", "so far", "latest", "live ",
        "real-time", "realtime", "these days", "this week", "this weekend", "yet", "on time",
        "still open", "still have", "still available", "still in stock", "still down", "still running",
        "지금", "오늘", "현재", "실시간", "요즘", "최신", "이 시각", "방금", "아직", "이번 주",
        # the caller's own live state ("has my refund gone through", 제 주문 배송 출발했어요?)
        "balance", "my order", "where is my", "status of my", "tracking",
        "잔액", "잔고", "배송 조회", "배송조회", "주문 상태", "어디쯤", "현황", "제 주문", "내 주문", "제 환불",
        "내 환불", "제 택배", "내 택배", "처리됐", "처리 됐", "끝났나",
        # prices, rates and markets
        "exchange rate", "interest rate", "stock price", "share price", "trading at", "환율", "주가", "시세",
        "금리", "이율",
        # outages and service state
        "outage", " down?", "is it down", "down right", "running late", "delayed", "maintenance", "장애", "먹통",
        "점검 중", "지연",
        # stock, queues and crowds
        "in stock", "sold out", "wait time", "waiting time", "queue", "crowded", "seats left", "left?", "are left", "is left", "left for",
        "재고", "품절", "대기", "혼잡", "붐비", "남은 좌석", "남아 있", "남아있",
        # conditions outside
        "weather", "forecast", "traffic", "pollen", "air quality", "날씨", "미세먼지", "교통", "꽃가루"])
    # masked PII means the answer is about a person: personal, never shared
    cache_masked_entities: bool = False
    # negation and contrast ("not", 안/못, "instead of", 말고) were the gate's false hits on three
    # held-out sets in a row (docs/ARCHITECTURE.md): such prompts bypass the cache unless turned on
    serve_negated: bool = False
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
    # the calibrated verifier after the gate (verifier.py): off only to measure the gate alone
    verifier: bool = True
    verifier_path: str | None = Field(None, description="a fitted verifier (llmpipe cache-fit); None: the shipped one")
    verifier_threshold: float | None = Field(None, ge=0.0, le=1.5, description="None: the calibrated threshold")

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


PLACEHOLDER = re.compile(r"<[A-Z_]+_\d+>")


@lru_cache(maxsize=8)
def _volatile_pattern(keywords: tuple[str, ...]) -> re.Pattern[str]:
    parts = [rf"\b{re.escape(k)}\b" if re.fullmatch(r"[a-z][a-z' ]*[a-z]", k) else re.escape(k) for k in keywords]
    return re.compile("|".join(parts) or r"(?!)")


_NEGATED = re.compile("|".join([*NEGATION_COUNT, ALTERNATIVE, *(rf"\b{re.escape(w)}\b" for w in NEGATION_EN),
                                 *(re.escape(k) for k in NEGATION_KO)]))


def negated_or_contrasted(text: str) -> bool:
    """A negation or a contrast anywhere in the prompt (lexicon: NEGATION_*, ALTERNATIVE)."""
    return _NEGATED.search(text.lower()) is not None


def volatile_match(text: str, keywords: tuple[str, ...]) -> str | None:
    """The first volatile keyword in the text (CachePolicy.volatile_keywords), or None."""
    m = _volatile_pattern(keywords).search(text.lower())
    return m.group(0) if m else None


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
    if not policy.cache_masked_entities and PLACEHOLDER.search(text):
        return "personal_entities"
    rule = policy.domains.get(domain)
    if rule is None or rule.threshold is None:
        return f"domain_not_cached:{domain}"
    if volatile_match(text, tuple(policy.volatile_keywords)):
        return "volatile_keyword"
    if not policy.serve_negated and negated_or_contrasted(text):
        return "negated"
    if doc.body.temperature is not None and doc.body.temperature > 0 and doc.body.seed is None:
        return None  # sampling is fine: a cached answer is one valid sample
    return None
