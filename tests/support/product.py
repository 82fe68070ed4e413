"""The shared product stack: one `llmpipe up --processes` per test session with every product stage
and the real model, for the tests that only need a running product (docs/testing.md lists the
ones that need a stack of their own, and why).

Each test keeps to its own tenant (key) and request ids, so tests cannot see each other's rows:
acme, tight (rpm 1), other and slots (concurrency 2) are the front door's; `product` is the product
path's. Deployments: `local-vllm` (the real model) and `dead` (a closed port, for fallback and
error statuses). Adapters: `support-lora` registered for acme, `spare-lora` on disk for a live
registration."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pipeline.registries.adapters import adapter_digest
from pipeline.registries.tenants import key_hash, new_api_key
from tests.support.cli import running

BROKEN = "zzqbroken zzqbroken"  # the prompt the `broken` route's keywords match (both)
TENANTS = ("acme", "tight", "other", "slots", "product")
LIMITS = {"tight": {"rpm": 1}, "slots": {"concurrency": 2}}


@dataclass(frozen=True)
class ProductStack:
    info: dict
    keys: dict[str, str]
    data_dir: Path

    @property
    def http_url(self) -> str:
        return self.info["http_url"]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def product_config(data_dir: Path, keys: dict[str, str]) -> dict:
    roots = data_dir / "adapters"
    for name in ("support-lora", "spare-lora"):
        (roots / name).mkdir(parents=True, exist_ok=True)
        (roots / name / "adapter_config.json").write_text(json.dumps({"r": 8, "name": name}))
    return {
        "auth": {"required": True},
        "lora": {"allowed_roots": [str(roots)]},
        "adapters": [{"name": "support-lora", "revision": "r1", "path": str(roots / "support-lora"), "rank": 8,
                      "sha256": adapter_digest(roots / "support-lora"), "tenants": ["acme"]}],
        "tenants": [{"name": t, "limits": LIMITS.get(t, {}), "api_keys": [{"key_sha256": key_hash(k)}]}
                    for t, k in keys.items()],
        "deployments": [{"name": "local-vllm", "engine": "vllm", "json_schema": True},
                        {"name": "dead", "engine": "openai", "base_url": f"http://127.0.0.1:{closed_port()}/v1"}],
        "stages": [
            {"name": "mask"}, {"name": "cache"},
            {"name": "route", "policy": {"default_route": "simple", "routes": {
                "simple": {"model": "small", "deployments": ["local-vllm"], "exemplars": ["Say hello"]},
                # by keywords only: by meaning, "Name one animal that starts with letter Q" was nearer
                # "zzqbroken" than "Say hello", and the product path's load met the dead deployment
                "broken": {"model": "small", "deployments": ["dead"], "keywords": ["zzqbroken", "zzq"]},
            }}},
            {"name": "admit"}, {"name": "media"}, {"name": "vision"},
            {"name": "generate", "policy": {"prefer": ["local-vllm"],
                                            "retry": {"max_attempts": 2, "backoff_base_ms": 20,
                                                      "attempt_timeout_ms": 5000, "fallback_reserve_ms": 100}}},
            {"name": "postprocess"},
        ],
    }


@contextlib.contextmanager
def product_stack_in(data_dir: Path) -> Iterator[ProductStack]:
    keys = {t: new_api_key() for t in TENANTS}
    with running(product_config(data_dir, keys), data_dir, "--processes") as info:
        yield ProductStack(info, keys, data_dir)
