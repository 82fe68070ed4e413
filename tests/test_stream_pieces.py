"""Stream building blocks with no infrastructure: coalescing engine pieces into chunks, un-masking a
stream so that no placeholder fragment ever leaves, and what a caller is shown when attempts change."""

from __future__ import annotations

import random

import pytest

from pipeline.contracts import Response, Status
from pipeline.contracts.stream import Delta
from pipeline.ingress.stream_follow import StreamFollower
from pipeline.security.sealing import unmask
from pipeline.security.stream_unmask import MAX_PLACEHOLDER, StreamUnmasker
from pipeline.stages.generate.coalesce import Coalescer

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
    c = Coalescer(window_ms=25, max_tokens=4)
    first = c.add("a", [1], [-0.1], 0)  # nothing sent yet: no reason to wait
    assert first and (first.seq, first.text, first.token_ids, first.logprobs) == (0, "a", [1], [-0.1])
    assert [c.add("b", [2], [-0.2], 5), c.add("c", [3], [-0.3], 10)] == [None, None]
    assert not c.due(24) and c.due(25) and c.wait_ms(10) == 15
    assert c.take(25).text == "bc" and c.take(26) is None and not c.due(100)
    out = [c.add(x, [i], None, 30 + i) for i, x in enumerate("defg")]  # four tokens inside the window
    assert out[:3] == [None, None, None] and out[3] and out[3].text == "defg" and out[3].logprobs is None
    slow = c.add("h", [9], None, 80)  # the window since the last chunk has passed: it goes at once
    assert slow and (slow.seq, slow.text) == (3, "h")


def test_a_long_answer_is_tens_of_chunks_not_hundreds():
    c = Coalescer(window_ms=25, max_tokens=16)
    chunks = [ch for t in range(512) if (ch := c.add(f"w{t} ", [t], None, t * 2.0))]  # a token every 2 ms
    chunks += [c.take(10_000)] if c.due(10_000) else []
    assert "".join(ch.text for ch in chunks) == "".join(f"w{t} " for t in range(512))
    assert [ch.seq for ch in chunks] == list(range(len(chunks))) and len(chunks) <= 50


def test_slow_tokens_are_one_chunk_each():
    c = Coalescer(window_ms=25, max_tokens=16)
    chunks = [c.add(f"t{t}", [t], None, t * 40.0) for t in range(10)]  # slower than the window
    assert all(ch is not None for ch in chunks) and [ch.text for ch in chunks] == [f"t{t}" for t in range(10)]


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
    """Stands in for the producer: what a DeltaSink hands over, in order (the broker path is tested on
    the stack, tests/test_http_frontdoor.py)."""

    def __init__(self) -> None:
        self.sent: list[Delta] = []

    async def send(self, topic, value, key=None, partition=None):
        import orjson

        self.sent.append(Delta.model_validate(orjson.loads(value)))
        assert (topic, key, partition) == ("deltas", b"r", 3)


@pytest.mark.asyncio
async def test_a_delta_sink_sends_in_order_flushes_on_a_timer_and_ends_with_what_it_held():
    import asyncio

    from pipeline.stages.generate.stream import DeltaSink

    rec = _Recorder()
    sink = DeltaSink("r", "w:1", producer=rec, topic="deltas", partition=3,
                     unmasker=StreamUnmasker(MAPPING), window_ms=20, max_tokens=16)
    sink.piece("Hi ", [1], None)  # goes at once
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
