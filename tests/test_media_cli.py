"""`llmpipe submit --image` as a user runs it, against `llmpipe up` with media and vision: an image
URL, a local file (sent inline) and an uploaded blob (`llmpipe blobs put`) are all described to the
model; a hostile URL and another tenant's blob are refused."""

from __future__ import annotations

import asyncio

import pytest
import yaml

from pipeline.contracts.request import ChatMessage, ImageFeatures
from pipeline.engines.chat_engine import as_chat
from pipeline.stages.vision.describe import describe, with_description
from tests.support.cli import last_json, llmpipe
from tests.support.media_servers import jpeg

pytestmark = [pytest.mark.integration]


@pytest.mark.asyncio(loop_scope="session")
async def test_submit_image_url_and_local_file(tmp_path, image_server):
    cfg = tmp_path / "images.yaml"
    cfg.write_text(yaml.safe_dump({"stages": [
        {"name": "media", "policy": {"rules": {"test_allow": [f"127.0.0.1:{image_server.port}"]}}},
        {"name": "vision"}, {"name": "answer", "class": "tests.stages:Describe"}]}))
    photo = tmp_path / "photo.jpg"
    photo.write_bytes(jpeg(320, 240))

    def run(*args: str, timeout: float = 180):
        return asyncio.to_thread(llmpipe, *args, data_dir=tmp_path, timeout=timeout)

    up = await run("up", "--detach", "--config", str(cfg), "--json", timeout=300)
    assert up.returncode == 0, up.stderr
    try:
        by_url = await run("submit", "--prompt", "what is this?", "--image", f"{image_server.base}/ok.jpg", "--json")
        by_file = await run("submit", "--prompt", "and this?", "--image", str(photo), "--json")
        hostile = await run("submit", "--prompt", "x", "--image", "http://169.254.169.254/latest/meta-data/", "--json")
        put = await run("blobs", "put", str(photo), "--tenant", "acme", "--json")
        assert put.returncode == 0, put.stderr
        ref = last_json(put)["ref"]
        by_blob = await run("submit", "--prompt", "and this one?", "--image", ref, "--tenant", "acme", "--json")
        stolen = await run("submit", "--prompt", "mine now", "--image", ref, "--tenant", "other", "--json")
    finally:
        down = await run("down")
    assert down.returncode == 0, down.stderr
    assert ref.startswith("blob://acme/") and ref.endswith(".jpg")
    assert stolen.returncode == 2 and "blob_forbidden" in stolen.stderr
    for r in (by_url, by_file, by_blob):
        assert r.returncode == 0, r.stderr
        a = last_json(r)
        assert a["status"] == "ok" and a["text"].startswith("[image 1: "), a
    assert hostile.returncode == 2 and "fetch_refused" in hostile.stderr and "169.254.169.254" in hostile.stderr
    assert any(c.startswith("GET /ok.jpg") for c in image_server.connections)


def test_the_model_sees_the_description_before_the_last_user_message():
    msgs = [ChatMessage(role="system", content="be brief"), ChatMessage(role="user", content="hi"),
            ChatMessage(role="assistant", content="hello"), ChatMessage(role="user", content="what is it?")]
    feats = [ImageFeatures(index=0, labels=["ping-pong ball"], scores=[0.84], embedding_ref="x", cache="miss")]
    desc = describe(feats, "img-desc-v1")
    assert desc == "[image 1: ping-pong ball 0.84]"
    assert as_chat(with_description(msgs, desc)) == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"}, {"role": "user", "content": desc},
        {"role": "user", "content": "what is it?"}]
    assert len(msgs) == 4 and msgs[-1].content == "what is it?", "the caller's list is not changed"
    assert with_description([ChatMessage(role="system", content="s")], desc)[-1].content == desc
