"""Callers of a running stack for fault tests: a model-free gateway config, one chat call that reports
its status and error code, and a steady load of callers (tests/test_faults.py, tests/test_broker_roll.py)."""

from __future__ import annotations

import threading
import time

import httpx

from pipeline.registries.tenants import key_hash

TIMEOUT_S = 8.0  # each caller's deadline
SLACK_S = 1.5  # HTTP and scheduling on a 2-core host


def gateway_config(key: str, gen: dict | None = None) -> dict:
    return {"tenants": [{"name": "acme", "api_keys": [{"key_sha256": key_hash(key)}]}],
            "stages": [gen or {"name": "fakegen", "class": "tests.stages:FakeGenerate"}, {"name": "postprocess"}]}


def chat(url: str, key: str, timeout_s: float = TIMEOUT_S) -> tuple[int | str, str, float]:
    """(HTTP status or the exception's name, error code or "ok", seconds)."""
    t0 = time.monotonic()
    try:
        r = httpx.post(url + "/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, timeout=60,
                       json={"messages": [{"role": "user", "content": "hi"}], "llmpipe": {"timeout_s": timeout_s}})
    except httpx.HTTPError as exc:
        return type(exc).__name__, "", time.monotonic() - t0
    code = "ok" if r.status_code == 200 else (r.json().get("error") or {}).get("code", "")
    if r.status_code == 503:
        assert r.headers.get("retry-after"), "a 503 says when to retry"
    return r.status_code, code, time.monotonic() - t0


class Load:
    """`n` callers, each sending one request after another until stopped."""

    def __init__(self, url: str, key: str, n: int = 4) -> None:
        self.url, self.key = url, key
        self.results: list[tuple[float, int | str, str, float]] = []  # (sent at, status, code, seconds)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(n)]

    def _run(self) -> None:
        while not self._stop.is_set():
            sent = time.monotonic()
            self.results.append((sent, *chat(self.url, self.key)))

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in self._threads), "a caller hangs"
