"""One running product stack for the second security review's exploit tests (issue 35).

`llmpipe up` with mask, cache, route, admit, generate and postprocess, authentication at its
default, and generate on an OpenAI-compatible deployment answered at once by bench/mock_upstream.py
(no model: these tests are about what the stack refuses, not what a model says). Three tenants:
acme (alice: plain key; trainer: a key whose config grants the `rollouts` role), globex (bob), and
slowpoke (slow: rpm 5, for the metering tests).
Every test uses its own request ids, so tests cannot see each other's rows.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from pipeline.registries.tenants import key_hash, new_api_key
from pipeline.runtime.broker.embedded import free_port
from tests.support.cli import running
from tests.support.paths import ROOT

ROLLOUT_ROLE = "rollouts"


@dataclass
class Stack:
    info: dict
    data_dir: Path
    keys: dict[str, str]  # alice, trainer (acme); bob (globex); slow (slowpoke, rpm 5)
    upstream_url: str

    @property
    def http_url(self) -> str:
        return self.info["http_url"]

    @property
    def admin_url(self) -> str:
        return self.info["admin_url"]

    def admin_token(self) -> str:
        return (self.data_dir / "secrets" / "admin.token").read_text().strip()

    def chat(self, who: str | None, prompt: str, timeout: float = 60, headers: dict | None = None,
             **body) -> httpx.Response:
        h = {"authorization": f"Bearer {self.keys[who]}"} if who else {}
        return httpx.post(self.http_url + "/v1/chat/completions", timeout=timeout, headers={**h, **(headers or {})},
                          json={"messages": [{"role": "user", "content": prompt}], **body})

    def sql(self, query: str) -> list[list]:
        r = httpx.post(self.admin_url + "/sql", json={"query": query}, timeout=60,
                       headers={"authorization": f"Bearer {self.admin_token()}"})
        assert r.status_code == 200, r.text
        return r.json()["rows"]

    def rows_when(self, query: str, done=bool, timeout: float = 60) -> list[list]:
        """The query's rows once `done(rows)` holds (the sink writes within seconds); fails with
        the last rows seen otherwise."""
        deadline, rows = time.monotonic() + timeout, []
        while time.monotonic() < deadline:
            rows = self.sql(query)
            if done(rows):
                return rows
            time.sleep(0.5)
        raise AssertionError(f"after {timeout:.0f} s, {query!r} gave {rows!r}")


def _wait_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"the mock upstream did not listen on {port}")


# package scope: down once the last test of tests/security/ ran, not idling through the rest of the suite
@pytest.fixture(scope="package")
def review_stack(tmp_path_factory) -> Iterator[Stack]:
    port = free_port()
    upstream = subprocess.Popen([sys.executable, str(ROOT / "bench" / "mock_upstream.py"), "--port", str(port)],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_port(port)
        data_dir = tmp_path_factory.mktemp("review2")
        keys = {"alice": new_api_key(), "trainer": new_api_key(), "bob": new_api_key(), "slow": new_api_key()}
        config = {
            "tenants": [
                {"name": "acme", "api_keys": [
                    {"key_sha256": key_hash(keys["alice"]), "principal": "alice"},
                    {"key_sha256": key_hash(keys["trainer"]), "principal": "trainer", "roles": [ROLLOUT_ROLE]}]},
                {"name": "globex", "api_keys": [{"key_sha256": key_hash(keys["bob"]), "principal": "bob"}]},
                # a tenant with a low rate, for the metering tests (its key: `slow`)
                {"name": "slowpoke", "limits": {"rpm": 5},
                 "api_keys": [{"key_sha256": key_hash(keys["slow"]), "principal": "slow"}]},
            ],
            "deployments": [{"name": "mock", "engine": "openai", "base_url": f"http://127.0.0.1:{port}/v1",
                             "max_context": 32_768}],  # the mock takes any prompt (the race test sends ~10k tokens)
            "stages": [{"name": "mask"}, {"name": "cache"},
                       {"name": "route", "policy": {"default_route": "simple", "routes": {
                           "simple": {"model": "small", "deployments": ["mock"], "exemplars": ["Say hello"]}}}},
                       {"name": "admit"}, {"name": "generate", "policy": {"prefer": ["mock"]}},
                       {"name": "postprocess"}],
        }  # no `auth`: the default must be secure
        with running(config, data_dir) as info:
            yield Stack(info, data_dir, keys, f"http://127.0.0.1:{port}/v1")
    finally:
        upstream.terminate()
        upstream.wait(10)
