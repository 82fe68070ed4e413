"""`llmpipe demo` (make demo): start the embedded stack with the demo tenants, send the bundled
traffic through the HTTP front door with a progress bar, print the analyst report and what the
traffic showed, stop cleanly.

Traffic lines are OpenAI chat bodies plus demo fields: `tenant` (the demo issues each tenant a key
for this run), `idempotency_key`, `note` (what the line shows: its category before any `:`), and
`{images}` in image URLs (the local image server, pipeline/demo/images.py)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from pipeline.registries.tenants import key_hash
from pipeline.runtime.serve.metrics import percentile

# what each traffic category demonstrates, for the closing table
MEANING = {
    "support": "customer-support questions in English and Korean, with repeats and paraphrases: "
               "the second and later askers should be served from the cache (cache=hit)",
    "near-miss": "questions sharing words with cached ones but asking something else: must not hit",
    "shadow": "tenant beta runs the cache in shadow mode: would-be hits are recorded, never served",
    "pii": "emails, phones, card numbers, Korean names and addresses: masked before any stage sees "
           "them, restored in the answer, absent from the warehouse",
    "image": "pictures from the local image server: fetched, decoded and described by vision",
    "hostile": "image URLs media must refuse: metadata IP, local port, file:, internal redirect, "
               "decompression bomb, HTML posing as an image (422/413)",
    "tight limits": "tenants with rpm 6 and concurrency 1: the excess is answered 429 with Retry-After",
    "over budget": "a tenant whose daily budget covers about three requests: the rest get 429 budget_exhausted",
    "json schema": "answers that must satisfy a JSON Schema; the ones cut at 5 tokens cannot (502 schema_invalid)",
    "general": "other questions: routes simple / support / reasoning by meaning, keywords and complexity",
    "idempotency": "the same Idempotency-Key three times: one execution, the others get its answer",
    "invalid": "bodies the front door refuses before anything runs (422)",
    "unknown API key": "a key the front door does not know (401)",
}


@dataclass
class DemoLine:
    note: str
    tenant: str | None
    idempotency_key: str | None
    body: dict[str, Any]

    @property
    def category(self) -> str:
        return self.note.split(":")[0]


@dataclass
class Sent:
    category: str
    status: int
    code: str | None
    answered_by: str
    ms: float
    cache: str | None = None


@dataclass
class DemoRun:
    sent: list[Sent] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def by_category(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = defaultdict(lambda: {"requests": 0, "statuses": Counter(),
                                                              "codes": Counter(), "cache_hits": 0})
        for s in self.sent:
            c = out[s.category]
            c["requests"] += 1
            c["statuses"][s.status] += 1
            if s.code:
                c["codes"][s.code] += 1
            c["cache_hits"] += s.cache == "hit"
        return dict(out)

    def summary(self, seconds: float, report: dict[str, Any], report_html: Path) -> dict[str, Any]:
        """The run as one JSON document (`llmpipe demo --json`): statuses, latency, per category, the report."""
        latencies = [x.ms for x in self.sent if x.status == 200]
        return {"requests": len(self.sent), "seconds": seconds,
                "statuses": {str(k): n for k, n in sorted(Counter(x.status for x in self.sent).items())},
                "latency_ok_ms": {f"p{q}": percentile(latencies, q) for q in (50, 95, 99)},
                "categories": {k: {"requests": v["requests"], "statuses": {str(c): n for c, n in v["statuses"].items()},
                                   "codes": dict(v["codes"]), "cache_hits": v["cache_hits"]}
                               for k, v in self.by_category().items()},
                "report_html": str(report_html), "report": report}

    def reached_pipeline(self) -> int:
        """Requests published to Kafka (each gets a `requests` row); the door's own refusals are not."""
        return sum(1 for s in self.sent if s.answered_by != "frontdoor")


def read_demo_traffic(path: Path) -> list[DemoLine]:
    lines = []
    for n, raw in enumerate(path.read_bytes().splitlines(), start=1):
        if raw.strip():
            obj = orjson.loads(raw)
            lines.append(DemoLine(obj.pop("note", f"line {n}"), obj.pop("tenant", None),
                                  obj.pop("idempotency_key", None), obj))
    return lines


def demo_tenants(base: Path, *, unlimited: bool = False) -> list[str]:
    """The tenants of the demo's config; `unlimited`: only those without limits (the pace probes')."""
    return [t["name"] for t in yaml.safe_load(base.read_text()).get("tenants", []) if not (unlimited and t.get("limits"))]


def demo_config(base: Path, keys: dict[str, str], image_port: int) -> dict[str, Any]:
    """The demo's settings: examples/demo.yaml with this run's key hashes and the image server allowed."""
    cfg = yaml.safe_load(base.read_text())
    for t in cfg.get("tenants", []):
        t["api_keys"] = [{"key_sha256": key_hash(keys[t["name"]]), "principal": "demo"}]
    for st in cfg["stages"]:
        if st["name"] == "media":
            st.setdefault("policy", {}).setdefault("rules", {})["test_allow"] = [f"127.0.0.1:{image_port}"]
    return cfg


def _with_images(value: Any, base_url: str) -> Any:
    return orjson.loads(orjson.dumps(value).replace(b"{images}", base_url.encode()))


async def send_traffic(lines: list[DemoLine], http_url: str, keys: dict[str, str], images_url: str, *,
                       rate: float, concurrency: int, on_done: Callable[[], None]) -> DemoRun:
    run = DemoRun()
    slots = asyncio.Semaphore(concurrency)
    start = time.monotonic()
    async with httpx.AsyncClient(base_url=http_url, timeout=httpx.Timeout(300.0)) as client:

        async def one(line: DemoLine) -> None:
            try:
                headers = {"Authorization": f"Bearer {keys.get(line.tenant or '', 'lp-unknown-demo-key')}"}
                if line.idempotency_key:
                    headers["Idempotency-Key"] = line.idempotency_key
                t0 = time.monotonic()
                r = await client.post("/v1/chat/completions", json=_with_images(line.body, images_url),
                                      headers=headers)
                doc = r.json()
                code = doc["error"]["code"] if r.status_code != 200 else None
                cache = doc.get("llmpipe", {}).get("cache") if r.status_code == 200 else None
                run.sent.append(Sent(line.category, r.status_code, code, r.headers.get("x-answered-by", ""),
                                     (time.monotonic() - t0) * 1000, cache))
            finally:
                slots.release()
                on_done()

        tasks = []
        for i, line in enumerate(lines):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await slots.acquire()
            tasks.append(asyncio.create_task(one(line)))
        await asyncio.gather(*tasks)
    return run


def status_summary(c: dict[str, Any]) -> str:
    parts = [f"{n}×{s}" for s, n in sorted(c["statuses"].items())]
    codes = ", ".join(f"{k} {n}" for k, n in c["codes"].most_common())
    return " ".join(parts) + (f" ({codes})" if codes else "")
