"""The development tenant: with authentication on by default, a fresh `llmpipe up` still answers
its first request.

1. On start, when `auth.required` and `auth.dev_tenant` are set, the key is read from
   DATA_DIR/secrets/dev-api-key, or created there (mode 0600, in a 0700 directory) if absent.
2. The tenant and the key's hash are published on `control` on every start: the embedded broker
   keeps topics in memory, so a restarted stack must learn the key again. Only the hash travels.
3. The key itself is shown once, by the `llmpipe up` that created it; `llmpipe submit`, `load` and
   `rollouts submit` use it when no --api-key is given.
"""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.config.settings import Settings, kafka_kwargs
from pipeline.contracts.control import ApiKeyIssued, TenantUpsert
from pipeline.registries.tenants import key_hash, new_api_key
from pipeline.runtime.broker.gate import GatedProducer
from pipeline.runtime.codec import encode
from pipeline.runtime.topics import TopicNames

DEV_KEY_FILE = "dev-api-key"


def dev_key_path(data_dir: Path) -> Path:
    return data_dir / "secrets" / DEV_KEY_FILE


def read_dev_key(data_dir: Path) -> str | None:
    path = dev_key_path(data_dir)
    return path.read_text().strip() if path.is_file() else None


def _read_or_create(data_dir: Path) -> tuple[str, bool]:
    path = dev_key_path(data_dir)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip(), False
    key = new_api_key()
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key, True


async def ensure_dev_tenant(settings: Settings, bootstrap: str) -> bool | None:
    """Steps 1-2. None: no development tenant is configured; else whether its key was created now."""
    tenant = settings.auth.dev_tenant
    if not settings.auth.required or not tenant:
        return None
    key, created = _read_or_create(settings.resolved_data_dir())
    digest = key_hash(key)
    topic = TopicNames(settings.topic_prefix)("control")
    producer = GatedProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False,
                             **kafka_kwargs(settings.kafka))
    await producer.start()
    try:
        await producer.send_and_wait(topic, encode(TenantUpsert(tenant=tenant, limits={})),
                                     key=f"tenant:{tenant}".encode())
        # the developer's own key may ask for rollouts (`llmpipe rollouts submit`: mask's default rollout_role)
        issued = ApiKeyIssued(tenant=tenant, key_sha256=digest, principal="dev", roles=["rollouts"])
        await producer.send_and_wait(topic, encode(issued), key=f"key:{digest}".encode())
    finally:
        await producer.stop()
    return created
