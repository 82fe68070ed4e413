"""media on a real broker: image requests from an allow-listed local server, data URLs and blob
references are decoded and stored as claim checks; bad images get their error class; text-only
requests skip media; blobs never cross tenants."""

from __future__ import annotations

import asyncio
import base64
from collections import Counter

import numpy as np
import pytest

from pipeline.app.assemble import topology_for
from pipeline.app.launch import stage_worker
from pipeline.contracts import Evidence
from pipeline.contracts.request import ChatBody, ChatMessage
from pipeline.ingress import Client
from pipeline.runtime.codec import decode
from pipeline.runtime.topics import TopicNames
from pipeline.stores.blob_store import BlobError, LocalBlobStore
from tests.support.kafka import create_topics, read_topic, settings_for
from tests.support.media_servers import jpeg, png

on_loop = pytest.mark.asyncio(loop_scope="session")
pytestmark = [pytest.mark.integration]



def body(text: str, imgs: list[str]) -> ChatBody:
    return ChatBody(messages=[ChatMessage(role="user", content=text)], images=imgs)


@on_loop
async def test_image_requests_are_decoded_stored_and_answered(broker, prefix, tmp_path, image_server):
    policy = {"rules": {"test_allow": [f"127.0.0.1:{image_server.port}"]}}
    s = settings_for(tmp_path, prefix, broker.bootstrap,
                     [{"name": "media", "policy": policy}, {"name": "answer", "class": "tests.stages:Answer"}])
    await create_topics(s)
    store = LocalBlobStore(tmp_path / "blobs")
    uploaded = store.put("acme", png(40, 30), "png")
    topo = topology_for(s)
    workers = [stage_worker(s, topo, n, broker.bootstrap) for n in ("media", "answer")]
    await asyncio.gather(*(w.start() for w in workers))
    try:
        async with Client(broker.bootstrap, topic_prefix=prefix) as client:
            docs = [client.build(body=body(f"what is in image {i}?", [f"{image_server.base}/img/{i}.jpg"]),
                                 tenant_id="acme", timeout_s=120) for i in range(100)]
            inline = "data:image/jpeg;base64," + base64.b64encode(jpeg(320, 200)).decode()
            docs += [client.build(body=body("inline", [inline, uploaded]), tenant_id="acme", timeout_s=120),
                     client.build(body=body("text only", []), tenant_id="acme", timeout_s=120),
                     client.build(body=body("stolen", [uploaded]), tenant_id="other", timeout_s=120),
                     client.build(body=body("ssrf", ["http://169.254.169.254/latest/meta-data/"]), tenant_id="acme",
                                  timeout_s=120),
                     client.build(body=body("bomb", [f"{image_server.base}/bomb.jpg"]), tenant_id="acme", timeout_s=120),
                     client.build(body=body("html", [f"{image_server.base}/page.html"]), tenant_id="acme", timeout_s=120)]
            futs = await client.submit_many(docs)
            answers = [await client.wait(d.request_id, f, 120) for d, f in zip(docs, futs)]
    finally:
        for w in reversed(workers):
            await w.stop()
    by_status = Counter((a.status.value, a.error_class) for a in answers)
    assert by_status[("ok", None)] == 102, by_status
    assert [(a.status.value, a.error_class) for a in answers[-4:]] == [
        ("rejected", "blob_forbidden"), ("rejected", "fetch_refused"), ("rejected", "too_many_pixels"),
        ("rejected", "unsupported_format")]
    assert all(len(a.images) == 1 and a.images[0].kind == "jpeg" for a in answers[:100])
    assert {(i.kind, i.width, i.height) for i in answers[100].images} == {("jpeg", 320, 200), ("png", 40, 30)}
    assert answers[101].images == [] and answers[101].answered_by == "answer"
    rows = [decode(r.value, Evidence) for r in await read_topic(broker.bootstrap, TopicNames(prefix).evidence, 10**9,
                                                                 timeout=3)]
    media = [e for e in rows if e.stage == "media"]
    assert Counter(e.decision for e in media) == {"decoded": 101, "refused": 4}, "text-only skipped media"
    assert all(e.scores["decode_ms"] > 0 and e.scores["bytes"] > 0 for e in media if e.decision == "decoded")
    assert not any(e.request_id == docs[101].request_id for e in media)
    # claim checks: the tensor is the processor's output; another tenant cannot read it
    doc_refs = [e for e in media if e.request_id == docs[0].request_id]
    assert doc_refs
    tensors = list((tmp_path / "blobs" / "acme").rglob("*.npy"))
    distinct = len({(64 + i % 7, 48 + i % 5) for i in range(100)}) + 2  # the server's images + inline + uploaded
    assert len(tensors) == distinct, "content-addressed: an image seen twice is stored once"
    x = np.load(tensors[0])
    assert x.shape == (3, 224, 224) and x.dtype == np.float32
    with pytest.raises(BlobError) as err:
        store.get(uploaded, "other")
    assert err.value.error_class == "blob_forbidden"


def test_submit_sends_local_files_as_data_urls(tmp_path):
    from pipeline.cli.traffic import _image_arg

    f = tmp_path / "cat.jpg"
    f.write_bytes(jpeg(20, 10))
    url = _image_arg(str(f))
    assert url.startswith("data:image/jpeg;base64,") and base64.b64decode(url.split(",", 1)[1]) == f.read_bytes()
    assert _image_arg("https://example.com/cat.jpg") == "https://example.com/cat.jpg"
    assert _image_arg(str(tmp_path / "missing.jpg")) == str(tmp_path / "missing.jpg"), "not a file: left for media to refuse"


def test_the_requests_row_records_the_image_shape():
    from pipeline.contracts import Response
    from pipeline.contracts.response import ImageShape
    from pipeline.stores.warehouse_rows import REQUESTS_COLUMNS, request_row

    r = Response(request_id="r1", status="ok", answered_by="postprocess",
                 images=[ImageShape(kind="jpeg", width=640, height=427, bytes=50_000, decode_ms=6.5),
                         ImageShape(kind="png", width=32, height=32, bytes=900, decode_ms=0.4)])
    row = dict(zip(REQUESTS_COLUMNS, request_row(r)))
    assert (row["image_count"], row["image_bytes"], row["image_max_pixels"], row["image_decode_ms"]) == (2, 50_900, 273_280, 6.9)
