"""Test-only stages that drive the runtime (the product ships no pass-through stages).

Each decides something small and checkable, so tests can assert on decisions, not just on flow.
"""

from __future__ import annotations

import asyncio
import os

from pipeline.contracts import RequestDoc, Response, Status
from pipeline.runtime.errors import StageError
from pipeline.runtime.stage import Outcome, Stage


class Classify(Stage):
    """Decides `long` or `short` by prompt length against policy.threshold; forwards."""

    async def process(self, doc: RequestDoc) -> Outcome:
        threshold = int(self.ctx.policy.get("threshold", 20))
        n = len(doc.prompt_text())
        decision = "long" if n > threshold else "short"
        doc = doc.model_copy(update={"labels": {**doc.labels, "class": decision}})
        return Outcome.forward(doc, self.evidence(doc, decision, f"length_{'above' if n > threshold else 'at_most'}_threshold",
                                                  scores={"length": float(n), "threshold": float(threshold)}))


class Answer(Stage):
    """Answers with the prompt upper-cased; raises on prompts that ask it to (`explode`)."""

    processed = 0  # per process; the deadline test checks nothing was processed

    async def process(self, doc: RequestDoc) -> Outcome:
        type(self).processed += 1
        prompt = doc.prompt_text()
        if "explode" in prompt:
            raise StageError("asked to explode", error_class="test_explosion")
        route = doc.route.decision if doc.route else doc.labels.get("class")
        resp = Response(request_id=doc.request_id, status=Status.ok, text=prompt.upper(), answered_by=self.name,
                        route=route)
        return Outcome.answer(doc, resp, self.evidence(doc, "answered", "uppercase"))


class Relay(Stage):
    """Forwards unchanged with a `relayed` decision: the hop-latency benchmark's link."""

    async def process(self, doc: RequestDoc) -> Outcome:
        return Outcome.forward(doc, self.evidence(doc, "relayed"))


class Sleep(Stage):
    """Sleeps policy.sleep_ms per record, then answers (or forwards, with policy.forward): a slow stage
    for backpressure and bottleneck tests."""

    async def process(self, doc: RequestDoc) -> Outcome:
        await asyncio.sleep(float(self.ctx.policy.get("sleep_ms", 50)) / 1000)
        if self.ctx.policy.get("forward"):
            return Outcome.forward(doc, self.evidence(doc, "slept"))
        resp = Response(request_id=doc.request_id, status=Status.ok, text="slept", answered_by=self.name)
        return Outcome.answer(doc, resp, self.evidence(doc, "slept"))


class Record(Stage):
    """Answers and records which process handled it (multi-process tests)."""

    async def process(self, doc: RequestDoc) -> Outcome:
        resp = Response(request_id=doc.request_id, status=Status.ok, text=str(os.getpid()), answered_by=self.name)
        return Outcome.answer(doc, resp, self.evidence(doc, "recorded"))


class BatchLength(Stage):
    """A micro-batching stage (like embeddings): records the size of the batch each record rode in."""

    max_batch = 16
    max_wait_ms = 50

    async def process_batch(self, docs: list[RequestDoc]) -> list[Outcome | BaseException]:
        out: list[Outcome | BaseException] = []
        for doc in docs:
            resp = Response(request_id=doc.request_id, status=Status.ok, text=str(len(docs)), answered_by=self.name)
            out.append(Outcome.answer(doc, resp, self.evidence(doc, "batched", scores={"batch_size": float(len(docs))})))
        return out



class PatientBatch(BatchLength):
    """BatchLength that would wait two seconds for a batch to fill."""

    max_wait_ms = 2000

class Spend(Stage):
    """Answers after policy.sleep_ms, having spent exactly what admit reserved: the budget's worst case."""

    async def process(self, doc: RequestDoc) -> Outcome:
        from pipeline.contracts.response import Usage

        await asyncio.sleep(float(self.ctx.policy.get("sleep_ms", 0)) / 1000)
        adm = doc.admission
        resp = Response(request_id=doc.request_id, status=Status.ok, text="spent", answered_by=self.name,
                        cost_usd=adm.cost_reserved_usd if adm else 0.0,
                        usage=Usage(prompt_tokens=adm.tokens_reserved if adm else 0))
        return Outcome.answer(doc, resp, self.evidence(doc, "spent"))


class Unique(Stage):
    """Answers, after policy.sleep_ms, with a token no other execution produces: equal answers
    prove one execution (idempotency tests)."""

    async def process(self, doc: RequestDoc) -> Outcome:
        import uuid

        await asyncio.sleep(float(self.ctx.policy.get("sleep_ms", 0)) / 1000)
        resp = Response(request_id=doc.request_id, status=Status.ok, text=uuid.uuid4().hex, answered_by=self.name)
        return Outcome.answer(doc, resp, self.evidence(doc, "executed"))


class Placement(Stage):
    """Answers with where admit placed the request: `deployment|fallbacks`, after policy.sleep_ms."""

    async def process(self, doc: RequestDoc) -> Outcome:
        await asyncio.sleep(float(self.ctx.policy.get("sleep_ms", 0)) / 1000)
        adm = doc.admission
        text = f"{adm.deployment}|{','.join(adm.deployments)}" if adm else "unadmitted"
        resp = Response(request_id=doc.request_id, status=Status.ok, text=text, answered_by=self.name)
        return Outcome.answer(doc, resp, self.evidence(doc, "placed"))


class Describe(Stage):
    """Answers with the conversation a model would read after vision (one line per message), for
    vision tests: vision's description of the images, then the caller's question."""

    async def process(self, doc: RequestDoc) -> Outcome:
        text = "\n".join(m.content for m in doc.body.messages) if doc.vision else "no vision"
        resp = Response(request_id=doc.request_id, status=Status.ok, text=text, answered_by=self.name)
        return Outcome.answer(doc, resp, self.evidence(doc, "described"))


class Grow(Stage):
    """Forwards requests that say `grow` padded by policy.pad_bytes: a stage whose output no longer
    fits its topic's record limit."""

    async def process(self, doc: RequestDoc) -> Outcome:
        pad = int(self.ctx.policy.get("pad_bytes", 0)) if "grow" in doc.prompt_text() else 0
        doc = doc.model_copy(update={"labels": {**doc.labels, "pad": "x" * pad}})
        return Outcome.forward(doc, self.evidence(doc, "grown", scores={"pad": float(pad)}))


class FakeGenerate(Stage):
    """Fills the generation section the way generate does, without a model, so postprocess (the
    product stage) validates, writes back and answers: the answer names the caller's principal,
    and a request that says `backtrack` gets a string built to make a catastrophic regex spin."""

    async def process(self, doc: RequestDoc) -> Outcome:
        from pipeline.contracts.request import GenerationSection

        prompt = doc.prompt_text()
        text = '"' + "a" * 40 + '!"' if "backtrack" in prompt else f"answer for {doc.principal}"
        gen = GenerationSection(deployment="fake", model="fake", model_revision="fake@1", text=text,
                                prompt_token_ids=[1], token_ids=[2], finish_reason="stop", tokens_in=1, tokens_out=1,
                                ttft_ms=1.0)
        doc = doc.model_copy(update={"generation": gen})
        return Outcome.forward(doc, self.evidence(doc, "generated", "fake"))


class CrashWhileFlagged(FakeGenerate):
    """FakeGenerate that exits with code 3 at start while the file `policy.flag` exists: a worker in a
    crash loop, for the supervisor's restart backoff."""

    async def start(self) -> None:
        flag = self.ctx.policy.get("flag")
        if flag and os.path.exists(flag):
            os._exit(3)
        await super().start()
