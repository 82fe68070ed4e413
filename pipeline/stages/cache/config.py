"""The cache stage's policy model (parse-only): modes per tenant and domain, domains with their
thresholds and TTLs, the boundary revisions, volatile words that bypass the cache, and the gate's and
verifier's settings. The decisions over it are policy.py's."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field

from pipeline.config.policy import PolicyModel

Mode = Literal["on", "shadow", "off"]


class DomainRule(PolicyModel):
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
        "payments": DomainRule(threshold=0.60, ttl_s=86_400, keywords=["refund", "charge", "charged", "card", "payment", "invoice",  # noqa: E501 - word data
                                                          "환불", "결제", "카드", "청구"]),
        "medical": DomainRule(threshold=0.60, ttl_s=86_400, keywords=["symptom", "dose", "dosage", "medicine", "doctor", "pain",
                                                         "증상", "복용", "약", "병원", "통증"]),
    }


class CachePolicy(PolicyModel):
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
        "in stock", "sold out", "wait time", "waiting time", "queue", "crowded", "seats left", "left?", "are left", "is left", "left for",  # noqa: E501 - word data
        "재고", "품절", "대기", "혼잡", "붐비", "남은 좌석", "남아 있", "남아있",
        # conditions outside
        "weather", "forecast", "traffic", "pollen", "air quality", "날씨", "미세먼지", "교통", "꽃가루"])
    # answers resting on tool results whose every result the caller versioned (context.tool_versions):
    # the versions, tools and arguments join the boundary (cache/tool_results.py)
    cache_versioned_tool_results: bool = False
    # masked PII means the answer is about a person: personal, never shared
    cache_masked_entities: bool = False
    # negation and contrast ("not", 안/못, "instead of", 말고) were the gate's false hits on three
    # held-out sets in a row (docs/decisions/0008-cache-verification-gate-and-calibrated-verifier.md): such
    # prompts bypass the cache unless turned on
    serve_negated: bool = False
    top_k: int = 5
    # entries expire only at search time: without a bound every unique miss stays in the index and
    # search slows with it. Per tenant, so that one tenant's traffic cannot evict another's entries.
    max_entries_per_tenant: int = Field(10_000, ge=1, description="index entries kept per tenant; "
                                        "beyond it the expired, then the oldest written, are deleted")
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
