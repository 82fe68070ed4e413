"""The cache's policy as pure functions: bypass rules, domains, boundaries and the gate."""

from __future__ import annotations

import pytest

from pipeline.contracts import RequestDoc
from pipeline.contracts.request import RequestContext
from pipeline.stages.cache_policy import (
    CachePolicy,
    boundary_for,
    bypass_reason,
    content_words,
    detect_domain,
    gate,
    negated,
    numbers,
)

POLICY = CachePolicy()


def doc(text: str, **ctx) -> RequestDoc:
    return RequestDoc(request_id="r", tenant_id="t1", body={"messages": [{"role": "user", "content": text}]},
                      context=RequestContext(**ctx))


def lexical(words, against):  # a word matches only itself: isolates the gate's lexical rules
    return [1.0 if w in against else 0.0 for w in words]


@pytest.mark.parametrize("ctx,reason", [
    ({"personalised": True}, "personalised"),
    ({"tool_side_effects": True}, "tool_side_effects"),
    ({"volatile": True}, "volatile_data"),
])
def test_declared_bypass_reasons(ctx, reason):
    assert bypass_reason(doc("What are your opening hours?", **ctx), POLICY, "faq") == reason


def test_policy_bypass_reasons():
    assert bypass_reason(doc("What is my balance?"), POLICY, "faq") == "volatile_keyword"
    assert bypass_reason(doc("Email <EMAIL_ADDRESS_1> the manual"), POLICY, "faq") == "personal_entities"
    never = CachePolicy(domains={"faq": {"threshold": None}})
    assert bypass_reason(doc("What are your opening hours?"), never, "faq") == "domain_not_cached:faq"
    assert bypass_reason(doc("What are your opening hours?"), POLICY, "faq") is None


def test_domain_detection_and_mode_precedence():
    assert detect_domain(doc("I want a refund for my card"), POLICY) == "payments"
    assert detect_domain(doc("비밀번호를 잊어버렸어요"), POLICY) == "account"
    assert detect_domain(doc("anything", domain="medical"), POLICY) == "medical"
    assert detect_domain(doc("What are your opening hours?"), POLICY) == "faq"
    p = CachePolicy(mode="on", tenant_modes={"t1": "shadow"}, domain_modes={"medical": "off"})
    assert p.mode_for("t1", "faq") == "shadow" and p.mode_for("t2", "faq") == "on" and p.mode_for("t1", "medical") == "off"


def test_every_boundary_field_comes_from_the_request_or_policy():
    b = boundary_for(doc("hi", locale="ko", acl_scope="role:agent", data_version="kb-7"), POLICY, "faq", "emb@1")
    assert b.as_payload() == {"tenant": "t1", "acl_scope": "role:agent", "model_revision": "default@r1",
                              "prompt_revision": "prompt@r1", "data_version": "kb-7", "locale": "ko",
                              "embedding_revision": "emb@1", "domain": "faq"}


def test_gate_refuses_near_misses_that_cosine_cannot():
    assert not gate("Reset my password", "Reset my router", lexical, 0.6).passed
    assert gate("How do I reset my password?", "how do i reset my password", lexical, 0.6).passed
    v = gate("Ship 3 boxes", "Ship 4 boxes", lexical, 0.6)
    assert not v.passed and v.checks["numbers"] is False
    v = gate("Can I cancel my order?", "Why can't I cancel my order?", lexical, 0.6)
    assert not v.passed and v.checks["negation"] is False
    v = gate("환불 가능한가요?", "환불이 안 되나요?", lexical, 0.6)
    assert not v.passed and v.checks["negation"] is False
    assert not gate("Call <PERSON_1>", "Call <PERSON_2>", lexical, 0.6).checks["entities"]


def test_gate_accepts_paraphrased_words_through_the_word_similarity():
    def sims(words, against):
        close = {("wipe", "clear"), ("clear", "wipe")}
        return [1.0 if w in against or any((w, a) in close for a in against) else 0.0 for w in words]

    assert gate("How do I wipe the cache?", "How can I clear the cache", sims, 0.6).passed
    assert not gate("How do I wipe the cache?", "How can I clear the cache", lexical, 0.6).passed
    # named things never pass on similarity, whatever the embedding says
    assert not gate("Side effects of Tylenol?", "Side effects of Advil?", lambda w, a: [0.99] * len(w), 0.6).passed
    assert not gate("Is the sale on this weekend?", "Is the sale on next weekend?", sims, 0.6).passed
    assert not gate("카톡 알림음 바꾸는 법", "카톡 배경화면 바꾸는 법", lambda w, a: [0.99] * len(w), 0.6).passed
    assert gate("비밀번호를 어떻게 재설정하나요?", "비밀번호 재설정 방법 알려주세요", lexical, 0.6).passed


def test_text_features():
    assert numbers("Order 1,200 units by 12.5") == {"1200", "12.5"}
    assert negated("I can't log in") and negated("로그인이 안 돼요") and not negated("I can log in")
    assert content_words("비밀번호를 어떻게 재설정하나요?") == content_words("비밀번호 재설정 방법 알려주세요")
