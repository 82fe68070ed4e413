"""Stream building blocks with no infrastructure: coalescing engine pieces into chunks, and
un-masking a stream so that no placeholder fragment ever leaves."""

from __future__ import annotations

import random

import pytest

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


def test_chunks_flush_on_tokens_or_on_the_window_and_keep_everything():
    c = Coalescer(window_ms=25, max_tokens=4)
    out = [c.add("a", [1], [-0.1], 0), c.add("b", [2], [-0.2], 5), c.add("c", [3], [-0.3], 10)]
    assert out == [None, None, None] and not c.due(24) and c.due(25)
    first = c.add("d", [4], [-0.4], 12)  # the fourth token fills it
    assert first and (first.seq, first.text, first.token_ids, first.logprobs) == (0, "abcd", [1, 2, 3, 4],
                                                                                  [-0.1, -0.2, -0.3, -0.4])
    assert c.add("e", [5], None, 100) is None and c.due(125)
    late = c.take()
    assert late and (late.seq, late.text, late.logprobs) == (1, "e", None) and c.take() is None
    assert c.add("f", [6], None, 200) is None and c.add("g", [7], None, 230).text == "fg"  # the window passed


def test_a_long_answer_is_tens_of_chunks_not_hundreds():
    c = Coalescer(window_ms=25, max_tokens=16)
    chunks = [ch for t in range(512) if (ch := c.add(f"w{t} ", [t], None, t * 2.0))]  # a token every 2 ms
    chunks += [c.take()] if c.due(10_000) else []
    assert "".join(ch.text for ch in chunks) == "".join(f"w{t} " for t in range(512))
    assert [ch.seq for ch in chunks] == list(range(len(chunks))) and len(chunks) <= 50
