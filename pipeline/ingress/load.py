"""`llmpipe load`: replay a JSONL file of OpenAI chat bodies at a rate, and summarise the answers."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from pipeline.contracts import RequestDoc, Response
from pipeline.ingress.client import Client, ClientTimeout
from pipeline.ingress.openai_body import BodyError, chat_body
from pipeline.runtime.codec import describe_validation_error
from pipeline.runtime.serve.metrics import percentile


@dataclass
class TrafficLine:
    line_no: int
    body: dict[str, Any]
    api_key: str | None
    idempotency_key: str | None


@dataclass
class InvalidLine:
    line_no: int
    reason: str


def read_traffic(path: Path) -> tuple[list[TrafficLine], list[InvalidLine]]:
    good, bad = [], []
    for n, raw in enumerate(path.read_bytes().splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            bad.append(InvalidLine(n, f"not JSON: {exc.msg}"))
            continue
        if not isinstance(obj, dict):
            bad.append(InvalidLine(n, "not a JSON object"))
            continue
        good.append(TrafficLine(n, obj, obj.pop("api_key", None), obj.pop("idempotency_key", None)))
    return good, bad


@dataclass
class LoadSummary:
    sent: int = 0
    by_status: Counter = field(default_factory=Counter)
    by_error_class: Counter = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)
    invalid_lines: list[InvalidLine] = field(default_factory=list)
    duplicates_dropped: int = 0

    def as_json(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "by_status": dict(self.by_status),
            "by_error_class": dict(self.by_error_class),
            "latency_ms": {f"p{q}": percentile(self.latencies_ms, q) for q in (50, 95, 99)},
            "invalid_lines": len(self.invalid_lines),
            "duplicates_dropped": self.duplicates_dropped,
        }


def _to_doc(client: Client, line: TrafficLine, timeout_s: float, default_key: str | None) -> RequestDoc:
    return client.build(body=chat_body(line.body), timeout_s=timeout_s, api_key=line.api_key or default_key,
                        idempotency_key=line.idempotency_key)


async def run_load(
    client: Client,
    lines: list[TrafficLine],
    *,
    rate: float | None,
    concurrency: int,
    timeout_s: float,
    api_key: str | None = None,
    on_done: Callable[[], None] | None = None,
    to_doc: Callable[[TrafficLine], RequestDoc] | None = None,
    on_response: Callable[[Response], None] | None = None,
) -> LoadSummary:
    """Send every line (at `rate` per second, at most `concurrency` waiting) and count the answers.
    `to_doc` builds a line's request (default: an OpenAI chat body); `on_response` sees each answer."""
    summary = LoadSummary()
    slots = asyncio.Semaphore(concurrency)
    start = time.monotonic()

    async def one(i: int, line: TrafficLine) -> None:
        try:
            try:
                doc = to_doc(line) if to_doc is not None else _to_doc(client, line, timeout_s, api_key)
            except (BodyError, ValidationError) as exc:
                reason = describe_validation_error(exc) if isinstance(exc, ValidationError) else str(exc)
                summary.invalid_lines.append(InvalidLine(line.line_no, reason))
                return
            t0 = time.monotonic()
            summary.sent += 1
            try:
                resp: Response = await client.request(doc, timeout_s)
                summary.by_status[resp.status.value] += 1
                if resp.error_class:
                    summary.by_error_class[resp.error_class] += 1
                summary.latencies_ms.append((time.monotonic() - t0) * 1000)
                if on_response is not None:
                    on_response(resp)
            except ClientTimeout:
                summary.by_status["error"] += 1
                summary.by_error_class["client_timeout"] += 1
        finally:
            slots.release()
            if on_done:
                on_done()

    tasks = []
    for i, line in enumerate(lines):
        if rate:
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        await slots.acquire()
        tasks.append(asyncio.create_task(one(i, line)))
    await asyncio.gather(*tasks)
    summary.duplicates_dropped = client.duplicates
    return summary
