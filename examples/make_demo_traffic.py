"""Writes examples/demo_traffic.jsonl, the traffic `llmpipe demo` sends (deterministic: rerun after
editing and commit both). Each line is an OpenAI chat-completions body plus demo fields:
`tenant` (a tenant the demo creates and holds the key of), `idempotency_key`, `note` (what the line
shows), and `{images}` in image URLs (the demo's local image server)."""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).with_name("demo_traffic.jsonl")

# Customer-support questions, each with paraphrases: repeats and close paraphrases should hit the cache.
SUPPORT = [
    ("faq", "en", ["What are your opening hours?", "When are you open?", "What are your opening hours?",
                   "What time do you open?"]),
    ("account", "en", ["How do I reset my password?", "I forgot my password, how can I reset it?",
                       "How do I reset my password?", "How can I change my password?"]),
    ("shipping", "en", ["How long does delivery take?", "How many days does shipping take?",
                        "How long does delivery take?", "When will my delivery arrive usually?"]),
    ("payments", "en", ["How do I get a refund?", "How can I request a refund?", "How do I get a refund?",
                        "What is your refund policy?"]),
    ("tech", "en", ["How do I install the app?", "How can I install your app?", "How do I install the app?",
                    "The app will not install, what should I do?"]),
    ("faq", "en", ["Do you have a store in Seoul?", "Is there a shop in Seoul?", "Do you have a store in Seoul?",
                   "Where is your Seoul store?"]),
    ("account", "en", ["How do I delete my account?", "How can I close my account?", "How do I delete my account?",
                       "I want to remove my account."]),
    ("shipping", "en", ["Can I return an item?", "How do I return something I bought?", "Can I return an item?",
                        "What is the return process?"]),
    ("faq", "ko", ["영업시간이 어떻게 되나요?", "영업시간 알려주세요", "영업시간이 어떻게 되나요?", "몇 시에 문을 여나요?"]),
    ("account", "ko", ["비밀번호를 어떻게 재설정하나요?", "비밀번호를 잊어버렸어요", "비밀번호를 어떻게 재설정하나요?",
                       "비밀번호 변경 방법 알려주세요"]),
    ("shipping", "ko", ["배송은 얼마나 걸리나요?", "택배 배송 기간이 궁금해요", "배송은 얼마나 걸리나요?", "배송 기간 알려주세요"]),
    ("payments", "ko", ["환불은 어떻게 받나요?", "환불 신청 방법 알려주세요", "환불은 어떻게 받나요?", "환불 규정이 궁금해요"]),
    ("tech", "ko", ["앱 설치는 어떻게 하나요?", "앱을 설치하는 방법 알려주세요", "앱 설치는 어떻게 하나요?",
                    "앱이 설치가 안 돼요"]),
]
# near-misses: share words with a cached question but ask something else (must not hit)
NEAR_MISSES = [("account", "en", "How do I reset my router?"), ("payments", "en", "How do I get a receipt?"),
               ("shipping", "en", "How long does a refund take?"), ("faq", "en", "Do you have a store in Busan?"),
               ("faq", "en", "What are your opening hours on Sunday?"), ("account", "ko", "비밀번호를 어떻게 만드나요?")]
PII = [
    "My email is {name}.{i}@example.com, please send the invoice there.",
    "Call me back at 010-{a:04d}-{b:04d} about my order.",
    "{kname}님 주문 {i}번 배송 상태를 알려주세요.",
    "My card 4111 1111 1111 1111 was charged twice, order {i}.",
    "I moved to 서울특별시 강남구 테헤란로 {i}길 12, please update my address.",
    "My name is {name} {surname} and my phone is +1 415 555 {a:04d}.",
]
NAMES = ["Jane", "John", "Maria", "Wei", "Aisha", "Lucas"]
SURNAMES = ["Doe", "Smith", "Garcia", "Chen", "Khan", "Silva"]
KNAMES = ["김민수", "이서연", "박지훈", "최유진"]
GENERAL = ["Explain step by step why the sky is blue.", "Compare email and chat support in two sentences.",
           "Write a haiku about autumn.", "Translate 'thank you' to Korean.", "Give me three tips for sleeping well.",
           "단계별로 이유를 설명해 주세요: 왜 바다는 짠가요?", "What is the capital of France?",
           "Name two primary colours.", "Summarise what a cache does in one sentence.", "Say hello in Spanish."]
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 80}}, "required": ["answer"],
          "additionalProperties": False}
HOSTILE = [("http://169.254.169.254/latest/meta-data/", "cloud metadata address"),
           ("http://127.0.0.1:22/", "a local port not on the allow-list"),
           ("file:///etc/passwd", "a file URL"),
           ("{images}/redirect-internal", "a redirect to an internal address"),
           ("{images}/bomb.png", "a decompression bomb: a small PNG claiming 30000x30000 pixels"),
           ("{images}/not-an-image", "HTML served as an image")]


SYSTEM = "You are a customer-support assistant. Answer in one short sentence."


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def support(text: str) -> list[dict]:
    """With this system prompt SmolLM2 mostly stops on its own within 48 tokens (23 of 26 support
    questions, measured): only complete answers are written back to the cache."""
    return [{"role": "system", "content": SYSTEM}, *user(text)]


def lines() -> list[dict]:
    """Two halves, each shuffled: the first askers of every support question come in the first half
    and the repeats and paraphrases in the second, once the first answers are in the cache."""
    rnd = random.Random(7)
    first: list[dict] = []
    later: list[dict] = []
    other: list[dict] = []
    models = [None, None, "gpt-4o-mini", "small"]  # what callers ask for; route decides what runs

    def ask(text, sys_prompt=False, **kw) -> dict:
        line = {"messages": support(text) if sys_prompt else user(text), **kw}
        model = models[rnd.randrange(len(models))]
        return {**line, "model": model} if model else line

    tenants = ["acme", "globex"]
    for tenant in tenants:  # each question family for two tenants: no cross-tenant hits
        for domain, locale, variants in SUPPORT:
            for k, v in enumerate(variants):
                (first if k == 0 else later).append(
                    ask(v, True, tenant=tenant, max_tokens=48, note="support",
                        llmpipe={"context": {"domain": domain, "locale": locale}}))
    for domain, locale, text in NEAR_MISSES:
        later.append(ask(text, True, tenant="acme", max_tokens=48, note="near-miss",
                         llmpipe={"context": {"domain": domain, "locale": locale}}))
    for domain, locale, variants in SUPPORT[:8]:  # the shadow-mode tenant: looked up, never served
        for k, v in enumerate(variants[:3]):
            (first if k == 0 else later).append(
                ask(v, True, tenant="beta", max_tokens=48, note="shadow",
                    llmpipe={"context": {"domain": domain, "locale": locale}}))
    for i in range(40):
        t = PII[i % len(PII)].format(i=i, a=rnd.randrange(10_000), b=rnd.randrange(10_000),
                                     name=NAMES[i % 6], surname=SURNAMES[(i // 6) % 6], kname=KNAMES[i % 4])
        other.append(ask(t + " Reply briefly.", tenant="acme", max_tokens=24, note="pii"))
    for i in range(24):
        img = ["red.png", "stripes.jpg", "gradient.png"][i % 3]
        q = ["What is in this picture?", "Describe this image in a few words.", "이 사진에 무엇이 있나요?"][i % 3]
        other.append({"tenant": "acme", "max_tokens": 24, "note": "image", "messages": [{"role": "user", "content": [
            {"type": "text", "text": q}, {"type": "image_url", "image_url": {"url": "{images}/" + img}}]}]})
    for url, why in HOSTILE:
        other.append({"tenant": "acme", "max_tokens": 16, "note": f"hostile: {why}", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": url}}]}]})
    for i in range(24):  # rpm 6 and concurrency 1: most of these are refused 429
        other.append(ask(f"Say a word about number {i}.", tenant=["tight-rpm", "tight-conc"][i % 2], max_tokens=12,
                         note="tight limits"))
    for i in range(12):  # a daily budget of about three requests: the rest are refused 429 budget_exhausted
        other.append(ask(f"Tell me a fun fact #{i}.", tenant="broke", max_tokens=24, note="over budget"))
    for i in range(16):
        other.append(ask(f"Reply in JSON: what colour is the sky? ({i})", tenant="acme", max_tokens=40 if i % 4 else 5,
                         note="json schema", response_format={"type": "json_schema",
                                                             "json_schema": {"name": "answer", "schema": SCHEMA}}))
    for i in range(44):
        other.append(ask(GENERAL[i % len(GENERAL)] + ("" if i < 10 else f" ({i})"), i % 2 == 0, tenant="globex",
                         max_tokens=40,
                         note="general"))
    for i in range(3):  # the same order three times with one Idempotency-Key: one execution
        other.append(ask("Confirm my order 1234.", tenant="acme", max_tokens=16, idempotency_key="order-1234",
                         note="idempotency"))
    other.append({"tenant": "acme", "messages": user("hi"), "temperature": -1, "note": "invalid: temperature"})
    other.append({"tenant": "acme", "messages": [], "note": "invalid: no messages"})
    other.append({"tenant": "nobody", "messages": user("hi"), "note": "unknown API key"})
    rnd.shuffle(other)
    half = len(other) // 2
    head, tail = first + other[:half], later + other[half:]
    rnd.shuffle(head)
    rnd.shuffle(tail)
    return head + tail


if __name__ == "__main__":
    rows = lines()
    OUT.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"{len(rows)} lines -> {OUT}")
