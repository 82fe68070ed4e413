"""media -> vision on a real broker: 100 image requests from an allow-listed local server are all
answered with features; a second pass hits the feature cache; another tenant never does."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from pipeline.app.assemble import topology_for
from pipeline.app.launch import stage_worker
from pipeline.contracts import Evidence
from pipeline.contracts.request import ChatBody, ChatMessage
from pipeline.engines.mobilenet import MobileNetEncoder
from pipeline.ingress import Client
from pipeline.runtime.codec import decode
from pipeline.runtime.topics import TopicNames
from pipeline.stages.vision.describe import describe
from tests.support.kafka import create_topics, read_topic, settings_for

pytestmark = [pytest.mark.integration]



@pytest.mark.asyncio(loop_scope="session")
async def test_features_are_cached_per_tenant_and_described(broker, prefix, tmp_path, image_server):
    s = settings_for(tmp_path, prefix, broker.bootstrap,
                     [{"name": "media", "policy": {"rules": {"test_allow": [f"127.0.0.1:{image_server.port}"]}}},
                      {"name": "vision"}, {"name": "answer", "class": "tests.stages:Describe"}])
    names = TopicNames(prefix)
    await create_topics(s)
    topo = topology_for(s)
    workers = [stage_worker(s, topo, n, broker.bootstrap) for n in ("media", "vision", "answer")]
    await asyncio.gather(*(w.start() for w in workers))

    async def wave(client: Client, tenant: str, n: int) -> list:
        docs = [client.build(body=ChatBody(messages=[ChatMessage(role="user", content=f"what is this? {i}")],
                                           images=[f"{image_server.base}/img/{i}.jpg"]), tenant_id=tenant, timeout_s=180)
                for i in range(n)]
        futs = await client.submit_many(docs)
        return [(d, await client.wait(d.request_id, f, 180)) for d, f in zip(docs, futs)]

    try:
        async with Client(broker.bootstrap, topic_prefix=prefix) as client:
            first = await wave(client, "tenant-a", 100)
            second = await wave(client, "tenant-a", 100)
            other = await wave(client, "tenant-b", 20)
    finally:
        for w in reversed(workers):
            await w.stop()
    for batch in (first, second, other):
        assert all(a.status == "ok" and a.text.startswith("[image 1: ") for _, a in batch), [a for _, a in batch][:3]
        # vision's message comes first, the caller's question stays last and unchanged
        assert all(a.text.split("\n") == [a.text.split("\n")[0], d.body.messages[-1].content] for d, a in batch)
    assert [a.text for _, a in first] == [a.text for _, a in second], "the cache returns what the encoder said"
    rows = {e.request_id: e for e in (decode(r.value, Evidence) for r in
                                     await read_topic(broker.bootstrap, names.evidence, 10**9, timeout=3))
            if e.stage == "vision"}
    hits = lambda batch: sum(rows[d.request_id].scores["cache_hits"] for d, _ in batch)  # noqa: E731
    distinct = len({(64 + i % 7, 48 + i % 5) for i in range(100)})
    assert hits(first) <= 100 - distinct, "each distinct image was encoded at least once"
    assert hits(second) == 100, "the second pass is all feature-cache hits"
    assert hits(other) == 0, "another tenant never hits tenant-a's features"
    batches = [rows[d.request_id].scores["batch_records"] for d, _ in first]
    print(f"\nvision: first pass {int(hits(first))}/100 hits, second {int(hits(second))}/100, tenant-b "
          f"{int(hits(other))}/20; records per micro-batch max {max(batches):.0f}, mean {np.mean(batches):.1f}")
    assert max(batches) > 1, "records were micro-batched"
    encoded = sum(rows[d.request_id].scores["cache_misses"] for d, _ in first)
    assert encoded == distinct, "each distinct image encoded exactly once in the first pass"
    assert "encoder mobilenet_v2-imagenet@" in rows[first[0][0].request_id].reason

    def embeddings(tenant: str) -> int:
        return sum(np.load(p).shape == (1280,) for p in (tmp_path / "blobs" / tenant).rglob("*.npy"))

    assert embeddings("tenant-a") == distinct and embeddings("tenant-b") == 20, "one embedding per image and tenant"


def test_the_encoder_names_what_it_sees(tmp_path):
    import cv2

    from pipeline.stages.media.config import ProcessorConfig
    from pipeline.stages.media.decode import decode as decode_image

    enc = MobileNetEncoder(tmp_path / "models")
    img = np.full((224, 224, 3), 255, np.uint8)
    cv2.circle(img, (112, 112), 80, (0, 140, 255), -1)  # an orange ball
    ok, buf = cv2.imencode(".jpg", img)
    x = decode_image(buf.tobytes(), "jpeg", ProcessorConfig()).tensor
    [one] = enc.encode(x[None])
    assert one.embedding.shape == (1280,) and abs(float(np.linalg.norm(one.embedding)) - 1) < 1e-4
    assert one.top[0][0] in {"ping-pong ball", "orange", "tennis ball", "balloon"} and one.top[0][1] > 0.3, one.top
    again = MobileNetEncoder(tmp_path / "models")  # the export is reused, same revision
    assert again.revision == enc.revision and len(list((tmp_path / "models").glob("*.onnx"))) == 1
    from pipeline.contracts.request import ImageFeatures

    text = describe([ImageFeatures(index=0, labels=["a", "b"], scores=[0.5, 0.25], embedding_ref="x", cache="miss")],
                    "img-desc-v1")
    assert text == "[image 1: a 0.50, b 0.25]"
