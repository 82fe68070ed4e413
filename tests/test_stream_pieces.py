"""Stream building blocks with no infrastructure: coalescing engine pieces into chunks, un-masking a
stream so that no placeholder fragment ever leaves, and what a caller is shown when attempts change."""

from __future__ import annotations

import random

import pytest

from pipeline.contracts import Response, Status
from pipeline.contracts.stream import Delta
from pipeline.ingress.stream_follow import StreamFollower
from pipeline.runtime.stage import StreamPort
from pipeline.security.sealing import unmask
from pipeline.security.stream_unmask import MAX_PLACEHOLDER, StreamUnmasker
from pipeline.stages.generate.coalesce import Coalescer, Throttle

MAPPING = {"<EMAIL_ADDRESS_1>": "jane.doe@example.com", "<PERSON_1>": "Jane Doe", "<PERSON_10>": "Kim Minsu"}
ANSWER = "Dear <PERSON_1>, we wrote to <EMAIL_ADDRESS_1> and cc'd <PERSON_10>; 3 < 4 and a<b, <3 <html> <PERSON_2>."


def _split(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), k=rng.randint(1, len(text) // 2)))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


@pytest.mark.parametrize("seed", range(40))
def test_the_stream_restores_exactly_what_the_whole_text_restores(seed):
    pieces = _split(ANSWER, random.Random(seed))
    u = StreamUnmasker(MAPPING)
    sent = [u.feed(p) for p in pieces] + [u.flush()]
    assert "".join(sent) == unmask(ANSWER, MAPPING)
    for s in sent:  # never a fragment of a placeholder, never a placeholder that had a value
        assert "<EMAIL" not in s and "<PERSON_1" not in s and "ADDRESS_1>" not in s


@pytest.mark.parametrize("seed", range(10))
def test_a_tenant_that_may_not_unmask_gets_whole_placeholders(seed):
    pieces = _split(ANSWER, random.Random(seed))
    u = StreamUnmasker(MAPPING, restore=False)
    sent = [u.feed(p) for p in pieces] + [u.flush()]
    assert "".join(sent) == ANSWER and "jane" not in "".join(sent)
    fragments = [s for s in sent if "<EMAIL" in s]
    assert all("<EMAIL_ADDRESS_1>" in s for s in fragments)


def test_text_that_only_looks_like_an_opening_is_not_held_forever():
    u = StreamUnmasker(MAPPING)
    assert u.feed("x <") == "x " and u.feed("b") == "<b"  # not a capital: released at once
    assert u.feed("<" + "A" * MAX_PLACEHOLDER) == "<" + "A" * MAX_PLACEHOLDER  # too long to be one
    assert u.feed("end <PERS") == "end " and u.flush() == "<PERS"  # the stream ended: sent as it is


def test_the_first_piece_goes_at_once_then_at_most_one_chunk_per_window():
    c, th = Coalescer(max_tokens=4), Throttle(window_ms=25)
    assert c.add("a", [1], [-0.1]) and th.due(0)  # the attempt's first piece: no reason to wait
    first = c.take()
    th.sent(0)
    assert (first.seq, first.text, first.token_ids, first.logprobs) == (0, "a", [1], [-0.1])
    assert [c.add("b", [2], [-0.2]), c.add("c", [3], [-0.3])] == [False, False] and c.pending
    assert not th.due(24) and th.due(25) and th.wait_ms(10) == 15
    assert c.take().text == "bc" and c.take() is None and not c.pending
    th.sent(25)
    out = [c.add(x, [i], None) for i, x in enumerate("defg")]  # four tokens inside the window
    assert out == [False, False, False, True], "max_tokens waiting goes at once"
    four = c.take()
    assert four.text == "defg" and four.logprobs is None and four.seq == 2
    th.sent(33)
    assert not c.add("h", [9], None) and th.due(80)  # the window since the last flush has passed: it goes
    assert (c.take().seq, c.take(even_empty=True).seq) == (3, 4)


def _flushed(times_ms: list[float], window_ms: float = 25, max_tokens: int = 16) -> list:
    """DeltaFlusher's step 2 on a virtual clock for one stream: a piece goes at once when it asks to
    or the throttle is due, and otherwise with the timer, `window_ms` after the last flush."""
    c, th, chunks, last = Coalescer(max_tokens=max_tokens), Throttle(window_ms=window_ms), [], 0.0
    for t, at in enumerate(times_ms):
        if c.pending and th.due(at):  # the timer fired before this piece came
            chunks.append(c.take())
            last += window_ms
            th.sent(last)
        if c.add(f"w{t} ", [t], None) or th.due(at):
            chunks.append(c.take())
            last = at
            th.sent(at)
    chunks += [c.take()] if c.pending else []
    return chunks


def test_a_long_answer_is_tens_of_chunks_not_hundreds():
    chunks = _flushed([t * 2.0 for t in range(512)])  # a token every 2 ms
    assert "".join(ch.text for ch in chunks) == "".join(f"w{t} " for t in range(512))
    assert [ch.seq for ch in chunks] == list(range(len(chunks))) and len(chunks) <= 50


def test_slow_tokens_are_one_chunk_each():
    chunks = _flushed([t * 40.0 for t in range(10)])  # slower than the window
    assert [ch.text for ch in chunks] == [f"w{t} " for t in range(10)]


def _d(attempt: str, seq: int, text: str) -> Delta:
    return Delta(request_id="r", attempt=attempt, seq=seq, text=text, token_ids=[seq])


def _ok(text: str) -> Response:
    return Response(request_id="r", status=Status.ok, text=text, answered_by="postprocess")


def _show(f: StreamFollower, deltas: list[Delta], terminal: Response) -> tuple[str, str | None]:
    shown = [p.text for d in deltas if (p := f.delta(d)) is not None]
    rest, end = f.end(terminal)
    return "".join(shown) + (rest.text if rest else ""), end.error


def test_one_attempt_is_shown_as_it_comes_and_the_terminal_adds_nothing():
    f = StreamFollower()
    assert _show(f, [_d("a", 0, "Hel"), _d("a", 1, "lo "), _d("a", 1, "lo "), _d("a", 2, "there")],
                 _ok("Hello there")) == ("Hello there", None)  # the repeated seq (a producer retry) is dropped


def test_a_new_attempt_continues_cleanly_from_what_was_shown():
    f = StreamFollower()
    seen = [f.delta(_d("a", 0, "The capital ")), f.delta(_d("a", 1, "of France"))]
    assert [p.text for p in seen if p] == ["The capital ", "of France"]
    # attempt a died; b starts over: silent until it passes what was shown, then continues from there
    assert f.delta(_d("b", 0, "The capital of")) is None
    cont = f.delta(_d("b", 1, " France is Paris"))
    assert cont is not None and cont.text == " is Paris" and cont.token_ids is None  # part of b's piece
    assert f.delta(_d("a", 2, " is Lyon")) is None  # the abandoned attempt is never followed again
    rest, end = f.end(_ok("The capital of France is Paris."))
    assert rest is not None and rest.text == "." and end.ok and f.switches == 1


def test_an_attempt_that_disagrees_is_dropped_and_the_terminal_decides():
    f = StreamFollower()
    assert f.delta(_d("a", 0, "Blue is")).text == "Blue is"
    assert f.delta(_d("b", 0, "Red")) is None and f.delta(_d("b", 1, " is warm")) is None  # sampled otherwise
    assert _show(f, [], _ok("Red is warm")) == ("", "stream_diverged")  # never Blue is + Red is warm
    g = StreamFollower()
    assert g.delta(_d("a", 0, "Blue is")).text == "Blue is"
    assert _show(g, [_d("b", 0, "Blue is"), _d("b", 1, " cool")], _ok("Blue is cool")) == (" cool", None)


def test_a_missing_piece_stops_the_attempt_and_errors_end_the_stream():
    f = StreamFollower()
    assert f.delta(_d("a", 0, "one ")).text == "one " and f.delta(_d("a", 2, "three")) is None
    assert f.delta(_d("a", 3, "four")) is None  # after a gap nothing of that attempt is trusted
    assert _show(f, [], _ok("one two three four")) == ("two three four", None)
    err = Response(request_id="r", status=Status.error, error_class="schema_invalid", answered_by="postprocess")
    assert StreamFollower().end(err)[1].error == "schema_invalid"
    cancelled = Response(request_id="r", status=Status.cancelled, error_class="cancelled", answered_by="generate")
    assert StreamFollower().end(cancelled)[1].error == "cancelled"


@pytest.mark.parametrize("seed", range(20))
def test_any_crash_point_shows_the_answer_once(seed):
    """A worker dies after k deltas; the redelivered attempt streams the same text in other pieces:
    the caller is shown exactly the answer, with nothing twice."""
    rng = random.Random(seed)
    text = ANSWER * 2
    first, second = _split(text, rng), _split(text, rng)
    k = rng.randint(0, len(first))
    deltas = [_d("a", i, p) for i, p in enumerate(first[:k])] + [_d("b", i, p) for i, p in enumerate(second)]
    assert _show(StreamFollower(), deltas, _ok(text)) == (text, None)


class _Recorder:
    """Stands in for the producer: what the flusher hands over, in order, with the loop turn of each
    hand-over (the broker path is tested on the stack, tests/test_http_frontdoor.py)."""

    def __init__(self) -> None:
        self.sent: list[Delta] = []
        self.turns: list[int] = []
        self.turn = 0

    async def send(self, topic, value, key=None, partition=None):
        import orjson

        d = Delta.model_validate(orjson.loads(value))
        assert (topic, key, partition) == ("deltas", d.request_id.encode(), 3)
        self.sent.append(d)
        self.turns.append(self.turn)


@pytest.mark.asyncio
async def test_a_delta_sink_sends_in_order_flushes_on_a_timer_and_ends_with_what_it_held():
    import asyncio

    from pipeline.stages.generate.stream import DeltaFlusher, DeltaSink

    rec = _Recorder()
    flusher = DeltaFlusher(StreamPort(rec, "deltas"), window_ms=20, max_tokens=16)
    sink = flusher.sink("r", "w:1", 3, StreamUnmasker(MAPPING))
    sink.piece("Hi ", [1], None)  # goes at once (in the next loop turn, with whatever else came in this one)
    await asyncio.sleep(0)
    sink.piece("<PERSON", [2], None)  # waits for the window, then is held back by the un-masker
    sink.piece("_1", [3], None)
    await asyncio.sleep(0.06)  # the timer sent what waited (empty text: a placeholder is still open)
    sink.piece(">, hello", [4, 5], None)
    await sink.finish()
    assert [d.seq for d in rec.sent] == list(range(len(rec.sent))) and rec.sent[-1].last
    assert "".join(d.text for d in rec.sent) == "Hi Jane Doe, hello" and sink.tokens == 5
    assert [d.text for d in rec.sent[:2]] == ["Hi ", ""] and sum(len(d.token_ids) for d in rec.sent) == 5
    quiet = DeltaSink("r", "w:2")  # no stream asked for: it only counts
    quiet.piece("x", [1, 2], None)
    await quiet.finish()
    assert quiet.tokens == 2 and quiet.sent == 0
    await flusher.stop()


@pytest.mark.asyncio
async def test_concurrent_streams_flush_together_and_no_piece_waits_past_the_window():
    """One flush per window carries every stream's waiting piece: on the embedded broker each
    produce request is a batch, and a fetch lists every batch of its partition."""
    import asyncio
    import time

    from pipeline.stages.generate.stream import DeltaFlusher

    rec = _Recorder()
    window_s = 0.05
    flusher = DeltaFlusher(StreamPort(rec, "deltas"), window_ms=window_s * 1000, max_tokens=4)
    sinks = [flusher.sink(f"r{i}", f"w:{i}", 3) for i in range(4)]
    for i, s in enumerate(sinks):  # an engine step's first pieces for four requests, in one loop turn
        s.piece(f"{i}a", [1], None)  # a first piece goes at once (caller TTFT): in the next turn, all four
    while len(rec.sent) < 4:
        await asyncio.sleep(0)
    assert [d.request_id for d in rec.sent] == ["r0", "r1", "r2", "r3"] and flusher.flushes == 1
    rec.turn, t0 = 1, time.monotonic()
    for i, s in enumerate(sinks):  # within the window: all four wait for the one timer
        s.piece(f"{i}b", [2], None)
    await asyncio.sleep(0)
    assert len(rec.sent) == 4, "nothing went before the window passed"
    while len(rec.sent) < 8:
        await asyncio.sleep(0.002)
    waited = time.monotonic() - t0
    assert flusher.flushes == 2 and rec.turns[4:] == [1] * 4, "one flush carried all four, in one turn"
    assert [d.text for d in rec.sent[4:]] == ["0b", "1b", "2b", "3b"]
    assert waited < window_s + 0.04, f"a piece waited {waited * 1000:.0f} ms, past the window"
    rec.turn = 2
    for n in range(4):  # max_tokens waiting goes at once, window or not
        sinks[0].piece("x", [10 + n], None)
    for _ in range(5):
        await asyncio.sleep(0)
    assert rec.sent[-1].request_id == "r0" and rec.sent[-1].token_ids == [10, 11, 12, 13] and flusher.flushes == 3
    sinks[1].piece("late", [3], None)
    await sinks[1].abandon()  # a failed attempt: what waited is dropped, and nothing of it comes later
    await asyncio.sleep(window_s * 2)
    assert not any(d.request_id == "r1" and d.text == "late" for d in rec.sent)
    for s in sinks:
        await s.finish()
    assert [d.request_id for d in rec.sent if d.last] == ["r0", "r2", "r3"]
    for i in (0, 2, 3):
        seqs = [d.seq for d in rec.sent if d.request_id == f"r{i}"]
        assert seqs == list(range(len(seqs)))
    await flusher.stop()
    await flusher.stop()  # idempotent


# ---- sealed deltas (issue 35, finding 8): `deltas` is shared by every caller of a partition -------------

SECRET_ANSWER = ["Jane Doe's ", "card is 4111 1111 ", "1111 1111, ", "her plan: sell at dawn."]


async def _sealed_stream(keyring, request_id: str = "req-1") -> list[Delta]:
    import asyncio

    from pipeline.stages.generate.config import StreamPolicy
    from pipeline.stages.generate.stream import DeltaFlusher

    rec = _Recorder()
    flusher = DeltaFlusher(StreamPort(rec, "deltas"))
    flusher.configure(StreamPolicy(), keyring)  # the default policy seals
    sink = flusher.sink(request_id, "w:1", 3)
    for i, piece in enumerate(SECRET_ANSWER):
        sink.piece(piece, [100 + i, 200 + i], [-0.5, -0.25])
        while len(rec.sent) <= i:  # a delta each (the window passes)
            await asyncio.sleep(0.002)
    await sink.finish()
    await flusher.stop()
    return rec.sent


@pytest.mark.asyncio
async def test_a_sealed_delta_shows_a_topic_reader_neither_text_nor_tokens():
    from pipeline.runtime.codec import encode
    from pipeline.security.sealing import Keyring, open_delta

    keyring = Keyring.ephemeral()
    sent = await _sealed_stream(keyring)
    wire = b"".join(encode(d) for d in sent)
    for word in (b"Jane", b"4111", b"dawn", b"100", b"-0.5"):
        assert word not in wire, word  # what a reader of the topic gets
    assert len(sent) == 5 and all(d.text == "" and d.token_ids == [] and d.logprobs is None
                                  and d.sealed.startswith("d1.ephemeral.") for d in sent)
    opened = [open_delta(d, keyring) for d in sent]
    assert "".join(d.text for d in opened) == "".join(SECRET_ANSWER)
    assert [t for d in opened for t in d.token_ids] == [100, 200, 101, 201, 102, 202, 103, 203]


@pytest.mark.asyncio
async def test_a_sealed_delta_opens_only_for_its_request_place_and_key():
    from pipeline.security.sealing import Keyring, RestoreError, open_delta

    keyring = Keyring.ephemeral()
    d = (await _sealed_stream(keyring))[0]
    assert open_delta(d, keyring).text == SECRET_ANSWER[0]
    for moved in (d.model_copy(update={"request_id": "req-2"}), d.model_copy(update={"seq": 5}),
                  d.model_copy(update={"attempt": "w:9"}), d.model_copy(update={"tenant_id": "globex"})):
        with pytest.raises(RestoreError):
            open_delta(moved, keyring)  # another request's id, or another place in the stream
    with pytest.raises(RestoreError):
        open_delta(d, Keyring.ephemeral())  # another deployment's key
    other = (await _sealed_stream(keyring, "req-2"))[0]  # the same key: another request's delta key
    with pytest.raises(RestoreError):
        open_delta(other.model_copy(update={"request_id": "req-1"}), keyring)


def test_sealing_needs_the_keyring_and_can_be_turned_off():
    from pipeline.stages.generate.config import StreamPolicy
    from pipeline.stages.generate.stream import DeltaFlusher

    flusher = DeltaFlusher(StreamPort(_Recorder(), "deltas"))
    with pytest.raises(RuntimeError, match="keyring"):
        flusher.configure(StreamPolicy(), None)  # never a plain delta because the key was not there
    flusher.configure(StreamPolicy(seal=False), None)
    assert flusher.sink("r", "w:1", 3).sealer is None


@pytest.mark.asyncio
async def test_the_door_opens_sealed_deltas_and_skips_what_does_not_open():
    """A round trip through the client's delivery of deltas (the door's, ingress/client.py) and what
    the caller is shown: the door's keyring opens them; a client without it, or a forged delta, is
    shown nothing from deltas, and the terminal answer still ends the stream with the whole text."""
    import asyncio

    from pipeline.ingress.client import Client
    from pipeline.runtime.codec import encode
    from pipeline.security.sealing import Keyring

    keyring = Keyring.ephemeral()
    sent = await _sealed_stream(keyring)
    forged = (await _sealed_stream(Keyring.ephemeral()))[0].model_copy(update={"attempt": "w:0"})
    text = "".join(SECRET_ANSWER)
    for key, shown_from_deltas in ((keyring, text), (None, ""), (Keyring.ephemeral(), "")):
        client = Client("127.0.0.1:1")
        client.delta_keyring = key
        queue = client._streams["req-1"] = asyncio.Queue()
        for d in [forged, *sent]:
            client._deliver_delta(encode(d))
        follower, shown = StreamFollower(), ""
        while not queue.empty():
            piece = follower.delta(queue.get_nowait())
            shown += piece.text if piece else ""
        assert shown == shown_from_deltas and client.sealed_unread == (1 if key is keyring else 1 + len(sent))
        rest, end = follower.end(_ok(text))
        assert end.ok and shown + (rest.text if rest else "") == text
