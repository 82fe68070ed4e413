"""The Kafka client's stream against the embedded broker: what one poll that fetched a request's
deltas and its terminal answer together shows the caller."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaProducer

from pipeline.contracts import Response, Status
from pipeline.contracts.stream import Delta
from pipeline.ingress import Client
from pipeline.ingress.stream_follow import Ended, Piece
from pipeline.runtime.codec import encode
from tests.support.kafka import create_topics, settings_for

pytestmark = pytest.mark.integration


@pytest.mark.asyncio(loop_scope="session")
async def test_deltas_fetched_with_the_terminal_answer_are_shown_before_it(broker, prefix, tmp_path):
    """A short answer's deltas and its terminal answer often land between two polls of the client.
    The stream ends at the terminal answer, so the deltas fetched with it must be delivered first:
    otherwise the caller is shown the whole answer at the end, as if it had not streamed."""
    s = settings_for(tmp_path, prefix, broker.bootstrap, [{"name": "answer", "class": "tests.stages:Answer"}])
    await create_topics(s)
    async with Client(broker.bootstrap, topic_prefix=prefix) as client:
        assert client.consumer is not None and client.streams_on
        tps = client.consumer.assignment()
        client.consumer.pause(*tps)  # what follows lands between two polls
        doc = client.build("stream me")
        events: list[Piece | Ended] = []

        async def follow() -> None:
            events.extend([ev async for ev in client.stream(doc, 30)])

        task = asyncio.create_task(follow())
        p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
        await p.start()
        try:
            part, key = client.reply_partition, doc.request_id.encode()
            for seq, text in enumerate(["The answer ", "is yes."]):
                d = Delta(request_id=doc.request_id, attempt="w:1", seq=seq, text=text, last=seq == 1)
                await p.send_and_wait(client.names.deltas, encode(d), key=key, partition=part)
            resp = Response(request_id=doc.request_id, status=Status.ok, text="The answer is yes.",
                            answered_by="postprocess")
            await p.send_and_wait(client.names.responses, encode(resp), key=key, partition=part)
        finally:
            await p.stop()
        client.consumer.resume(*tps)
        await asyncio.wait_for(task, 30)
    end = events[-1]
    assert isinstance(end, Ended) and end.ok, end
    pieces = [ev for ev in events[:-1] if isinstance(ev, Piece)]
    assert [(p.text, p.attempt) for p in pieces] == [("The answer ", "w:1"), ("is yes.", "w:1")]
