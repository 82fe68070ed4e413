"""Feedback checks without infrastructure: declared metrics and their value types, one target,
the owner verdict, the warehouse row, and the CLI's reading of --value."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from pipeline.cli.common import CliError
from pipeline.cli.feedback import parse_value
from pipeline.config.feedback import FeedbackMetric, FeedbackSettings
from pipeline.contracts import Feedback
from pipeline.stores.owners import owner_refusal, verdict
from pipeline.stores.warehouse_rows import FEEDBACK_COLUMNS, feedback_row

S = FeedbackSettings()


def fb(**kw) -> Feedback:
    return Feedback.model_validate({"request_id": "r1", **kw})


@pytest.mark.parametrize("kw, refusal", [
    ({"metric": "thumbs_up", "value": True}, None),
    ({"metric": "rating", "value": 3}, None),
    ({"metric": "rating", "value": -0.5}, None),
    ({"metric": "comment", "value": "too long, see <EMAIL_ADDRESS_1>"}, None),
    ({"metric": "stars", "value": 5}, "unknown_metric"),
    ({"metric": "thumbs_up", "value": "true"}, "invalid_feedback"),
    ({"metric": "thumbs_up", "value": 1}, "invalid_feedback"),
    ({"metric": "rating", "value": True}, "invalid_feedback"),
    ({"metric": "rating", "value": math.inf}, "invalid_feedback"),
    ({"metric": "comment", "value": "   "}, "invalid_feedback"),
    ({"metric": "comment", "value": "x" * 8001}, "invalid_feedback"),
    ({"metric": "demonstration", "value": 2.0}, "invalid_feedback"),
    ({"metric": "task_success", "value": True}, "invalid_feedback"),  # an episode metric about a request
])
def test_a_value_must_fit_a_declared_metric_and_its_target(kw, refusal):
    got = S.refusal(fb(**kw))
    assert (got.error_class if got else None) == refusal
    if got is not None:
        assert got.status == 422 and got.reason


def test_an_episode_metric_takes_an_episode_target():
    assert S.refusal(Feedback(episode_id="ep-1", metric="task_success", value=False)) is None
    wrong = S.refusal(Feedback(episode_id="ep-1", metric="thumbs_up", value=False))
    assert wrong is not None and "give request_id" in wrong.reason


@pytest.mark.parametrize("kw", [
    {"metric": "rating", "value": 1},  # no target
    {"request_id": "r1", "episode_id": "e1", "metric": "rating", "value": 1},  # two
    {"request_id": "r1", "metric": "Rating", "value": 1},  # not a metric name
    {"request_id": "r 1", "metric": "rating", "value": 1},  # not an id
    {"request_id": "r1", "metric": "rating", "value": [1]},
    {"request_id": "r1", "metric": "rating", "value": 1, "extra": 1},
])
def test_malformed_feedback_does_not_validate(kw):
    with pytest.raises(ValidationError):
        Feedback.model_validate(kw)


def test_only_the_owner_may_give_feedback():
    assert verdict("acme", {"acme"}) == "ok"
    assert verdict("acme", {"acme", "other"}) == "ok"  # an episode id two tenants happened to choose
    assert verdict("acme", {"other"}) == "forbidden"
    assert verdict("acme", set()) == "unknown"
    assert owner_refusal("ok", "request") is None
    assert (owner_refusal("forbidden", "request").status, owner_refusal("unknown", "episode").status) == (403, 404)


def test_metric_names_are_unique():
    with pytest.raises(ValidationError, match="unique"):
        FeedbackSettings(metrics=[FeedbackMetric(name="a", type="boolean"), FeedbackMetric(name="a", type="float")])


def test_the_warehouse_row_keeps_the_type_and_the_value():
    row = dict(zip(FEEDBACK_COLUMNS, feedback_row(fb(metric="thumbs_up", value=True, tenant_id="acme"))))
    assert (row["metric_type"], row["value_float"], row["value_text"], row["target"]) == ("boolean", 1.0, "", "request")
    row = dict(zip(FEEDBACK_COLUMNS, feedback_row(Feedback(episode_id="e", metric="comment", value="ok <PERSON_1>"))))
    assert (row["metric_type"], row["value_float"], row["value_text"]) == ("text", None, "ok <PERSON_1>")
    assert row["episode_id"] == "e" and row["request_id"] == ""


def test_the_cli_reads_the_value_as_the_metric_takes_it():
    assert parse_value("true", "boolean") is True and parse_value("no", "boolean") is False
    assert parse_value("4.5", "float") == 4.5
    assert parse_value("4.5", "comment") == "4.5"
    with pytest.raises(CliError, match="true or false"):
        parse_value("maybe", "boolean")
    with pytest.raises(CliError, match="a number"):
        parse_value("high", "float")


def test_the_export_selector_reads_a_metric_and_a_bound():
    from pipeline.training.samples import feedback_selector

    assert feedback_selector("rating>=4", S) == ("rating", ">=", 4.0)
    assert feedback_selector("rating <= -0.5", S) == ("rating", "<=", -0.5)
    assert feedback_selector("rating", S) == ("rating", "", 0.0)
    assert feedback_selector("thumbs_up", S) == ("thumbs_up", ">=", 1.0)  # the good ones
    lower = FeedbackSettings(metrics=[FeedbackMetric(name="toxic", type="boolean", higher_is_better=False)])
    assert feedback_selector("toxic", lower) == ("toxic", "<=", 0.0)
    for bad in ("comment", "stars", "rating>4", "rating>=four"):
        with pytest.raises(ValueError, match="--from-feedback"):
            feedback_selector(bad, S)
