"""The cache's policy as pure functions: bypass rules, domains, boundaries and the gate."""

from __future__ import annotations

import pytest

from pipeline.contracts import RequestDoc
from pipeline.contracts.request import RequestContext
from pipeline.stages.cache.config import CachePolicy
from pipeline.stages.cache.gate import (
    GateRules,
    gate,
    negated,
    numbers,
    question_kinds,
    same_question,
)
from pipeline.stages.cache.policy import (
    acl_scope,
    boundary_for,
    bypass_reason,
    detect_domain,
)

POLICY = CachePolicy()
RULES = GateRules.build(CachePolicy(word_match=0.6))


@pytest.fixture(scope="module")
def analyze():
    """The real analyser (Kiwi + spaCy + wordfreq from installed packages): the gate's rules are
    about parts of speech, and a fake tagger would test nothing."""
    from pipeline.engines.text_analyzer import TextAnalyzer

    return TextAnalyzer().analyze


def doc(text: str, principal: str | None = None, roles: tuple[str, ...] = (), **ctx) -> RequestDoc:
    return RequestDoc(request_id="r", tenant_id="t1", body={"messages": [{"role": "user", "content": text}]},
                      principal=principal, roles=list(roles), context=RequestContext(**ctx))


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
    b = boundary_for(doc("hi", roles=("agent",), locale="ko", acl_scope="role:agent", data_version="kb-7"),
                     POLICY, "faq", "emb@1")
    assert b.as_payload() == {"tenant": "t1", "acl_scope": "role:agent", "model_revision": "default@r1",
                              "prompt_revision": "prompt@r1", "data_version": "kb-7", "locale": "ko",
                              "embedding_revision": "emb@1", "domain": "faq"}


def test_the_acl_scope_is_who_the_caller_is_never_what_it_claims():
    # `user` scopes are always the caller's own principal, whatever name the request writes
    assert acl_scope(doc("hi", principal="bob", acl_scope="user:alice")) == "user:bob"
    assert acl_scope(doc("hi", principal="bob", acl_scope="user")) == "user:bob"
    assert acl_scope(doc("hi", acl_scope="user:alice")) is None  # no principal: no user scope at all
    # a role or group scope needs the role, from the caller's key
    assert acl_scope(doc("hi", roles=("agent",), acl_scope="role:agent")) == "role:agent"
    assert acl_scope(doc("hi", roles=("agent",), acl_scope="role:admin")) is None
    assert acl_scope(doc("hi", roles=("sales",), acl_scope="group:sales")) == "role:sales"
    assert acl_scope(doc("hi", acl_scope="tenant")) == "tenant"
    assert acl_scope(doc("hi", acl_scope="tenant:other")) is None
    # a scope the caller does not hold neither reads nor writes the cache
    assert bypass_reason(doc("What are your opening hours?", roles=("agent",), acl_scope="role:admin"), POLICY,
                         "faq") == "acl_scope_not_held"
    assert boundary_for(doc("hi", principal="bob", acl_scope="user:alice"), POLICY, "faq", "e").acl_scope == "user:bob"


def test_gate_refuses_near_misses_that_cosine_cannot(analyze):
    def g(a, b, sims=lexical):
        return gate(a, b, analyze, sims, RULES)

    assert not g("Reset my password", "Reset my router").passed
    assert g("How do I reset my password?", "how do i reset my password").passed
    v = g("Ship 3 boxes", "Ship 4 boxes")
    assert not v.passed and v.checks["numbers"] is False
    v = g("Can I cancel my order?", "Why can't I cancel my order?")
    assert not v.passed and v.checks["negation"] is False
    v = g("환불 가능한가요?", "환불이 안 되나요?")
    assert not v.passed and v.checks["negation"] is False
    assert not g("인증 메일이 와요", "인증메일이 안와요").checks["negation"]  # 안 written on: Kiwi finds it
    assert not g("Call <PERSON_1>", "Call <PERSON_2>").checks["entities"]


def test_gate_skips_the_analysis_when_numbers_or_entities_already_differ(analyze):
    seen: list[str] = []
    words: list[list[str]] = []

    def counting(text):
        seen.append(text)
        return analyze(text)

    def sims(ws, against):
        words.append(ws)
        return lexical(ws, against)

    v = gate("Reply yes (order 5 a1b2)", "Reply yes (order 7 c3d4)", counting, sims, RULES)
    assert not v.passed and v.reason == "gate_failed:numbers" and set(v.checks) == {"numbers", "entities", "relations"}
    v = gate("Call <PERSON_1> now", "Call <PERSON_2> now", counting, sims, RULES)
    assert not v.passed and v.checks["entities"] is False
    assert seen == [] and words == [], "no analysis, no word embeddings"
    v = gate("Reply yes (order 5 abcd)", "Reply yes (order 5 efgh)", counting, sims, RULES)
    assert len(seen) == 2 and set(v.checks) == {"numbers", "entities", "relations", "question", "negation",
                                                "roles", "order", "modality", "content_words"}


def test_gate_refuses_a_different_action_or_added_specific_detail(analyze):
    def g(a, b):
        return gate(a, b, analyze, lexical, RULES).passed

    assert not g("How do I cancel my order?", "How do I change my order?")  # verb substituted
    assert not g("주문 취소는 어떻게 하나요?", "주문 변경은 어떻게 하나요?")  # verbal nouns are verbs
    assert not g("How do I update my profile picture?", "How do I update my profile bio?")  # bio tagged a verb
    assert not g("How do I reset my password?", "How do I reset my password on the router?")  # rare added noun
    assert not g("비밀번호 재설정 방법", "공유기 비밀번호 재설정 방법")
    assert not g("Can I return a laptop?", "Can I return a laptop bought on Amazon?")  # added name
    assert not g("How do I install the app?", "How do I update the app?")  # direction words must agree
    assert not g("How do I update the app?", "how to install the latest version of the app")  # install, again
    assert not g("2만원짜리 쿠폰 쓸 수 있어요?", "2천원짜리 쿠폰 쓸 수 있어요?")  # 2만 = 20000, 2천 = 2000


def test_gate_accepts_rewording(analyze):
    def g(a, b):
        return gate(a, b, analyze, lexical, RULES).passed

    assert g("How do I turn on dark mode in Outlook?", "outlook dark mode how to enable")  # phrasal verb
    assert g("5만원 부분 환불 가능한가요?", "50,000원 부분 환불 받을 수 있어?")  # numbers as quantities
    assert g("Can I use two gift cards?", "can I use 2 gift cards")
    assert g("how do i chnage my shipping address", "How do I change my shipping address?")  # swapped letters
    assert g("비밀번호를 어떻게 재설정하나요?", "비밀번호 재설정 방법 알려주세요")
    assert g("로그인 기록 확인할 수 있나요?", "로그인 내역 볼 수 있어요?")  # synonyms, 확인하다 ~ 보다
    assert g("How do I update the card on file?", "How do I update my card on file, please?")


def test_gate_accepts_paraphrased_words_through_the_word_similarity(analyze):
    def sims(words, against):
        close = {("wipe", "clear"), ("clear", "wipe")}
        return [1.0 if w in against or any((w, a) in close for a in against) else 0.0 for w in words]

    assert gate("How do I wipe the cache?", "How can I clear the cache", analyze, sims, RULES).passed
    assert not gate("How do I wipe the cache?", "How can I clear the cache", analyze, lexical, RULES).passed
    # named things never pass on similarity, whatever the embedding says
    assert not gate("Side effects of Tylenol?", "Side effects of Advil?", analyze, lambda w, a: [0.99] * len(w), RULES).passed
    assert not gate("Is the sale on this weekend?", "Is the sale on next weekend?", analyze, sims, RULES).passed
    assert not gate("카톡 알림음 바꾸는 법", "카톡 배경화면 바꾸는 법", analyze, lambda w, a: [0.99] * len(w), RULES).passed


def test_text_features(analyze):
    assert numbers("Order 1,200 units by 12.5") == {"1200", "12.5"}
    assert numbers("5만원") == numbers("50,000원") == {"50000"} and numbers("두 번") == numbers("2번") == {"2"}
    assert numbers("charged twice") == {"2"} and numbers("two cards") == {"2"}
    assert negated("I can't log in") and negated("로그인이 안 돼요") and not negated("I can log in")
    compound = [t.lemma for t in analyze("비밀번호 재설정 방법").tokens]
    assert compound[:2] == ["비밀번호", "재설정"]  # Kiwi's pieces joined back: 비밀+번호, 재+설정
    verbs = {t.lemma: t.kind for t in analyze("주문 확인할 수 있나요?").tokens}
    assert verbs["주문"] == "noun" and verbs["확인"] == "verb"


def test_a_deployment_extends_the_gate_vocabulary(analyze):
    default = GateRules.build(CachePolicy())
    own = GateRules.build(CachePolicy(gate_synonyms=[["pause", "hold"]], gate_specific_words=["local"]))
    a, b = "Can I pause my subscription?", "Can I hold my subscription?"
    assert not gate(a, b, analyze, lexical, default).passed and gate(a, b, analyze, lexical, own).passed
    # "local" is a frequent, generic-looking added word: by default it reads as a detail, but a shop
    # whose local delivery is another service says so in its policy
    a, b = "How long does shipping take?", "How long does local shipping take?"
    assert gate(a, b, analyze, lexical, default).passed and not gate(a, b, analyze, lexical, own).passed
    # service tiers are built in: express shipping is another product
    assert not gate(a, "How long does express shipping take?", analyze, lexical, default).passed


def test_gate_refuses_a_negation_that_moved_to_another_argument(analyze):
    def g(a, b):
        return gate(a, b, analyze, lexical, RULES)

    v = g("Sync works on Wi-Fi but not on mobile data", "Sync works on mobile data but not on Wi-Fi")
    assert not v.passed and v.checks["negation"] is True and v.checks["negation_scope"] is False
    v = g("카드 결제는 되는데 계좌이체는 안 돼요", "계좌이체는 되는데 카드 결제는 안 돼요")
    assert not v.passed and v.checks["negation_scope"] is False
    # the same thing negated on both sides is fine
    assert g("Sync works on Wi-Fi but not on mobile data", "Sync works on Wi-Fi, not on mobile data").passed
    assert g("I can't log in on the app", "I cannot log in on the app").checks["negation_scope"] is True
    # the prohibitive asks the opposite
    assert g("이 파일 삭제하지 마세요", "이 파일 삭제하세요").checks["negation"] is False


@pytest.mark.parametrize("a,b,same", [
    ("When will my refund arrive?", "Where will my refund arrive?", False),
    ("How much does it cost to cancel?", "How do I cancel?", False),
    ("Who can see my album?", "How can I share my album?", False),
    ("환불은 언제 들어오나요?", "환불은 어디로 들어오나요?", False),
    ("배송은 며칠 걸려요?", "배송비는 얼마예요?", False),
    ("How much is express shipping?", "What is the price of express shipping?", True),
    ("Where can I download my invoice?", "How do I get a copy of my invoice?", True),  # a kind on one side: rewording
    ("제품 보증 기간이 얼마나 돼요?", "제품 보증기간 얼마야?", True),  # 얼마 asks any quantity
    ("My battery drains fast", "Why does my battery drain so fast?", True),
])
def test_the_kind_of_answer_asked_for_must_agree(a, b, same):
    assert same_question(question_kinds(a), question_kinds(b)) is same


@pytest.mark.parametrize("a,b,same", [
    ("1차 접종 후 3주 지났어요", "1차 접종 후 3일 지났어요", False),  # the digit agrees, the unit does not
    ("14일 이내 반품", "2주 이내 반품", True),
    ("within 48 hours", "within two days", True),
    ("1 month", "30 days", True),
    ("3 weeks", "3 days", False),
    ("version 2.5", "version 2.5", True),
])
def test_time_spans_are_compared_in_hours(a, b, same):
    assert (numbers(a) == numbers(b)) is same


def test_gate_refuses_alternatives_set_the_other_way_round(analyze):
    def g(a, b):
        return gate(a, b, analyze, lexical, RULES)

    v = g("Can I get the parcel delivered to my office instead of my home?",
          "Can I get the parcel delivered to my home instead of my office?")
    assert not v.passed and v.checks["alternatives"] is False
    v = g("할부 말고 일시불로 바꿔주세요", "일시불 말고 할부로 바꿔주세요")
    assert not v.passed and v.checks["alternatives"] is False
    assert g("Ship it to my office instead of my home", "Ship it to my office instead of my home").passed


def test_gate_relations_and_undoing_words(analyze):
    def g(a, b):
        return gate(a, b, analyze, lexical, RULES)

    v = g("The rash appeared after I started the antibiotic", "The rash appeared before I started the antibiotic")
    assert not v.passed and v.checks["relations"] is False
    # a relation on one side only is rewording, not another relation
    assert g("Can I change the address after ordering?", "Can I change the address after ordering?").passed
    assert g("Can I change the address after ordering?", "I ordered; can I change the address?").checks["relations"]
    assert not g("재입고 알림 신청해 주세요", "재입고 알림 신청 취소해 주세요").passed
    v = g("해열제 먹었는데도 열이 안 떨어져요", "해열제 안 먹었는데도 열이 떨어졌어요")  # 는데도 splits clauses
    assert not v.passed and v.checks["negation_scope"] is False


def test_a_long_prompt_is_compared_on_its_question_too(analyze):
    context = ("Our workspace has fourteen members and the previous admin left the company last month. Her account "
               "was deactivated by IT for a while, and only an admin can transfer ownership of the workspace or "
               "reactivate an account. ")
    v = gate(context + "How can ownership of the workspace be transferred to me?",
             context + "Can her account be reactivated for a while instead?", analyze, lexical, RULES)
    assert not v.passed and v.checks["ask"] is False and v.checks["content_words"] is True
    same = gate(context + "How can ownership of the workspace be transferred to me?",
                context + "How can ownership of the workspace be transferred to me?", analyze, lexical, RULES)
    assert same.passed and same.checks["ask"] is True


@pytest.mark.parametrize("a,b,swapped", [
    ("Can I move money from my savings to checking?", "Can I move money from my checking to savings?", True),
    ("I paid in cash but the receipt says card", "I paid by card but the receipt says cash", True),
    ("부산에서 서울로 보내면 며칠 걸려요?", "서울에서 부산으로 보내면 며칠 걸려요?", True),
    ("할부로 산 거 일시불로 바꿀 수 있어요?", "일시불로 산 거 할부로 바꿀 수 있어요?", True),
    # word order and compounds are not swaps
    ("내일까지 서울로 배송 가능한가요?", "서울로 내일까지 배송 가능한가요?", False),
    ("How do I export contacts from Gmail?", "export my gmail contacts", False),
    ("Excel: how do I freeze the top row?", "freeze the first row in excel", False),
])
def test_two_words_that_trade_roles_are_another_question(analyze, a, b, swapped):
    from pipeline.stages.cache.gate import normalise, roles_swapped

    assert roles_swapped(a, b, analyze(normalise(a)), analyze(normalise(b))) is swapped


@pytest.mark.parametrize("a,b,same", [
    ("Can I split one payment across two cards?", "How do I split one payment across two cards?", False),
    ("수면제 매일 먹어도 돼요?", "수면제 몇 알 먹어야 돼요?", False),  # whether / how many
    ("해외결제 수수료 얼마예요?", "해외결제 수수료 왜 붙어요?", False),  # a cause on one side only
    ("편두통 왜 생겨요?", "편두통 생기면 뭐 먹어야 돼요?", False),
    ("Can I exercise with a cold?", "Is it ok to work out when I have a cold?", True),  # a conditional "when"
    ("배송지 변경 어케해요?", "배송지 변경은 어떻게 하나요?", True),
])
def test_whether_is_not_how_and_a_cause_is_asked_on_both_sides(a, b, same):
    assert same_question(question_kinds(a), question_kinds(b)) is same


def test_relations_and_opposite_prefixes():
    from pipeline.stages.cache.gate import opposite_prefixed, relations

    assert relations("Do kids under 5 get in free?") != relations("Do kids over 5 get in free?")
    assert relations("이 약 밥 먹기 전에 먹어요?") != relations("이 약 밥 먹고 나서 먹어요?")
    assert relations("How do I opt in to promos?") != relations("How do I opt out of promos?")
    assert opposite_prefixed("계정 공개로 바꾸는 방법", "계정 비공개로 바꾸는 방법")
    assert opposite_prefixed("비회원 주문 조회", "회원 주문 조회")
    assert not opposite_prefixed("비밀번호 바꾸는 법", "비밀번호 변경 방법")
    assert not opposite_prefixed("미국 배송", "미국으로 배송")


@pytest.mark.parametrize("text,volatile", [
    ("What is it now?", True), ("I know the answer", False), ("Is it snowing in Seoul?", False),
    ("How many seats are left for Saturday's show?", True), ("Has my refund been processed yet?", True),
    ("독감 백신 아직 남아있나요?", True), ("상담원 연결 대기 몇 명 남았어요?", True),
    ("Can I still change the delivery address?", False), ("Why did my payment get declined?", False),
])
def test_volatile_words_match_as_words(text, volatile):
    assert (bypass_reason(doc(text), POLICY, "faq") == "volatile_keyword") is volatile


@pytest.mark.parametrize("a,b,scrambled_", [
    (["sale", "item", "full", "price", "one"], ["full", "price", "item", "sale", "one"], True),
    (["email", "link", "multiple", "account"], ["account", "link", "multiple", "email"], True),
    (["내일", "서울", "배송", "가능"], ["서울", "내일", "배송", "가능"], False),  # one word moved
    (["lose", "receipt", "return", "day"], ["return", "day", "lose", "receipt"], False),  # one clause moved
])
def test_words_in_an_order_no_single_move_gives_are_another_question(a, b, scrambled_):
    from pipeline.stages.cache.order import scrambled

    assert scrambled(a, b) is scrambled_


def test_opposites_double_negation_and_the_speaker_role():
    from pipeline.stages.cache.gate import negations, opposite_sides
    from pipeline.stages.cache.order import speaker_role_flipped

    assert opposite_sides("Is autopay on by default?", "Is autopay off by default?")
    assert opposite_sides("Does the update install automatically?", "Do I have to install the update manually?")
    assert opposite_sides("적립금 적립은 언제 되나요?", "적립금 사용은 언제 되나요?")
    assert not opposite_sides("How do I connect the printer wirelessly?", "Connect the printer over wifi")
    assert negations("There's no way I can't get my money back") != negations("There's no way I can get my money back")
    assert negations("로그인이 안 돼요") == negations("로그인이 되지 않아요")
    assert speaker_role_flipped("Can the account owner remove me from the team?", "Can I remove the account owner?")
    assert speaker_role_flipped("관리자가 나를 팀에서 내보낼 수 있어?", "내가 관리자를 팀에서 내보낼 수 있어?")
    assert not speaker_role_flipped("How do I reset my password?", "How can I reset my password?")


@pytest.mark.parametrize("text,negated", [
    ("I can't log in", True), ("로그인이 안 돼요", True), ("할부 말고 일시불로", True),
    ("Ship it to my office instead of home", True), ("안녕하세요, 주문 문의드려요", False),
    ("How do I reset my password?", False), ("Can I cancel my order?", False),
])
def test_negated_prompts_bypass_the_cache_by_default(text, negated):
    assert (bypass_reason(doc(text), POLICY, "faq") == "negated") is negated
    assert bypass_reason(doc(text), CachePolicy(serve_negated=True), "faq") != "negated"


@pytest.mark.parametrize("a,b,check,passed", [
    # roles traded with no negation word: refused on order (pairs from cache_pairs_train3)
    ("Can I return something I bought abroad at a local store?",
     "Can I return something I bought locally at a store abroad?", "order", False),
    ("카카오로 가입했는데 이메일로 로그인 가능해?", "이메일로 가입했는데 카카오로 로그인 가능해?", "order", False),
    ("폰 화면을 TV로 미러링하려면?", "TV 화면을 폰으로 미러링하려면?", "order", False),
    ("탈퇴하면 앱도 삭제돼요?", "앱 삭제하면 탈퇴도 돼요?", "order", False),
    ("can you guys ship to a P.O. box address?", "can you guys ship from a P.O. box address?", "order", False),
    # a marked phrase or a whole clause moved, a keyword query, "the X of Y" / "Y X": one question
    ("On the mobile app, where do I change my password?", "Where do I change my password on the mobile app?",
     "order", True),
    ("If I lost the receipt, can I return it?", "Can I return it if I lost the receipt?", "order", True),
    ("삼성페이로 편의점에서 결제 돼요?", "편의점에서 삼성페이로 결제 돼요?", "order", True),
    ("포장 뜯은 상품도 반품되나요?", "반품되나요, 포장 뜯은 상품도?", "order", True),
    ("How do I take a screenshot on Windows 11?", "windows 11 screenshot how", "order", True),
    ("How much does express shipping cost?", "What is the price of express shipping?", "order", True),
    # may / must / must not
    ("수술 전날 물 마셔도 돼요?", "수술 전날 물 꼭 마셔야 돼요?", "modality", False),
    ("매장 안에서 사진 촬영 가능한가요?", "매장 안에서 사진 촬영 금지인가요?", "modality", False),
    ("Can I bring my dog inside?", "Are dogs allowed inside?", "modality", True),
    # a word said twice on one side stands for another word on the other
    ("카드 결제 취소하면 포인트도 취소되나요?", "카드 결제 취소해도 포인트는 유지되나요?", "content_words", False),
])
def test_order_modality_and_word_counts(analyze, a, b, check, passed):
    v = gate(a, b, analyze, lambda w, o: [1.0] * len(w), RULES)
    assert v.checks.get(check, True) is passed, v.checks


@pytest.mark.parametrize("text,roles", [
    ("Can I return it if I lost the receipt?", ["main", "cond"]),
    ("탈퇴하면 앱도 삭제돼요?", ["cond", "main"]),
    ("이틀 안에 도착하나요? 부산으로 보내면", ["main", "cond"]),
    ("카카오로 가입했는데 이메일로 로그인 가능해?", ["ctx", "main"]),
])
def test_clauses_are_typed_by_their_conjunction_or_ending(text, roles):
    from pipeline.stages.cache.order import typed_clauses

    clauses = typed_clauses(text)
    assert [r for r, _, _ in clauses] == roles
    assert all(text[lo:hi].strip() == text[lo:hi] and hi > lo for _, lo, hi in clauses)


def test_pairing_prefers_the_same_word_and_counts_order():
    from pipeline.stages.cache.order import out_of_order, pairing

    same = lambda a, b: a == b or {a, b} == {"cost", "price"}  # noqa: E731
    assert pairing(["price", "cost"], ["cost", "price"], same) == {0: 1, 1: 0}
    assert out_of_order(["a", "b", "c"], ["c", "a", "b"], same)
    assert not out_of_order(["a", "b", "a"], ["b", "a"], same)
    assert not out_of_order(["a", "x", "b"], ["a", "b", "y"], same)


PLAN = {"type": "function", "function": {"name": "get_plan", "parameters": {
    "type": "object", "properties": {"plan": {"type": "string"}}, "required": ["plan"]}}}


def tool_doc(args: str = '{"plan": "pro"}', versions: dict | None = None, tools=(), choice=None,
             result: str = '{"seats": 10}') -> RequestDoc:
    """A tool round trip: the question, the model's call, the caller's result."""
    call = {"id": "call_1", "type": "function", "function": {"name": "get_plan", "arguments": args}}
    return RequestDoc(request_id="r", tenant_id="t1", context=RequestContext(tool_versions=versions), body={
        "messages": [{"role": "user", "content": "How many seats does the Pro plan include?"},
                     {"role": "assistant", "content": "", "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": "call_1", "content": result}],
        "tools": list(tools), "tool_choice": choice})


def test_tool_results_bypass_unless_opted_in_and_every_result_is_versioned():
    opted = CachePolicy(cache_versioned_tool_results=True)
    assert bypass_reason(tool_doc(versions={"call_1": "v7"}), POLICY, "faq") == "tools"  # off by default
    assert bypass_reason(tool_doc(), opted, "faq") == "tool_result_unversioned"
    assert bypass_reason(tool_doc(versions={"other": "v7"}), opted, "faq") == "tool_result_unversioned"
    assert bypass_reason(tool_doc(versions={"call_1": "v7"}), opted, "faq") is None  # by call id
    assert bypass_reason(tool_doc(versions={"get_plan": "v7"}), opted, "faq") is None  # or by tool name
    # the answer may still be a call: an entry is a text answer
    assert bypass_reason(tool_doc(versions={"get_plan": "v7"}, tools=[PLAN]), opted, "faq") == "tools"
    assert bypass_reason(tool_doc(versions={"get_plan": "v7"}, tools=[PLAN], choice="none"), opted, "faq") is None
    # placeholders are numbered per request: a masked person's data is not another's
    masked = tool_doc(args='{"plan": "<PERSON_1>"}', versions={"get_plan": "v7"})
    assert bypass_reason(masked, opted, "faq") == "personal_entities"


def test_the_tool_results_version_arguments_and_tools_join_the_boundary():
    def version(**kw) -> str:
        return boundary_for(tool_doc(**kw), POLICY, "faq", "emb@1").data_version

    base = version(versions={"call_1": "v7"})
    assert base.startswith("+tools:") and base == version(versions={"get_plan": "v7"})
    assert base == version(args='{ "plan":"pro" }', versions={"call_1": "v7"})  # the same arguments, spaced
    assert base != version(versions={"call_1": "v8"})  # another version of the result
    assert base != version(args='{"plan": "team"}', versions={"call_1": "v7"})  # another call
    assert base != version(versions={"call_1": "v7"}, tools=[PLAN], choice="none")  # other tools in the prompt
    assert boundary_for(doc("hi", data_version="kb-7"), POLICY, "faq", "emb@1").data_version == "kb-7"
