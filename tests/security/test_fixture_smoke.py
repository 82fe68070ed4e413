import pytest

pytestmark = pytest.mark.integration


def test_the_review_stack_answers(review_stack):
    r = review_stack.chat("alice", "hello there")
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]
