"""A front door driven in process, with nothing published (tests of what the door decides alone)."""

from __future__ import annotations

import httpx

from pipeline.config.settings import Settings
from pipeline.contracts import RequestDoc, Response, Status
from pipeline.contracts.feedback import Feedback


def door_without_broker(tmp_path, owners=None):
    """A front door with two tenants (slow: rpm 2; busy) whose publishing is replaced: it records what
    would be published and answers ok. Returns the door, the tenants' keys and that record."""
    from pipeline.ingress.http import FrontDoor
    from pipeline.registries.tenants import key_hash
    from pipeline.security.sealing import keyring_for

    keys = {"slow": "lp-slow-key", "busy": "lp-busy-key"}
    s = Settings(data_dir=tmp_path, tenants=[
        {"name": "slow", "limits": {"rpm": 2}, "api_keys": [{"key_sha256": key_hash(keys["slow"])}]},
        {"name": "busy", "api_keys": [{"key_sha256": key_hash(keys["busy"])}]}])
    door = FrontDoor(s, "127.0.0.1:1", owners)
    door.client.reply_partition = 0  # never started: nothing reaches a broker
    door.keyring, door.ready = keyring_for(s), True
    published: list[str] = []

    async def wait(doc: RequestDoc, timeout_s: float) -> Response:
        published.append(doc.request_id)
        return Response(request_id=doc.request_id, status=Status.ok, text="hi", answered_by="postprocess")

    async def send_feedback(fb: Feedback) -> None:
        published.append(fb.feedback_id)

    door._wait = wait
    door.client.send_feedback = send_feedback
    return door, keys, published


async def post(door, path: str, key: str, body: dict) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=door.app), base_url="http://door") as c:
        return await c.post(path, json=body, headers={"authorization": f"Bearer {key}"})
