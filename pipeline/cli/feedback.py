"""`llmpipe feedback`: say what an answer (or an episode) was worth."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from pipeline.cli.app import app
from pipeline.cli.common import (
    Bootstrap,
    CliError,
    ConfigFile,
    DataDir,
    Json,
    _caller_key,
    _print_json,
    _settings,
    _stack_bootstrap,
    command,
    out,
)

TRUE, FALSE = {"true", "1", "yes", "up"}, {"false", "0", "no", "down"}


def parse_value(text: str, metric_type: str | None) -> Any:
    """--value as the metric's type: true/false, a number, or the text itself."""
    if metric_type == "boolean":
        if text.lower() in TRUE | FALSE:
            return text.lower() in TRUE
        raise CliError(f"--value: the metric takes true or false, got {text!r}")
    if metric_type == "float":
        try:
            return float(text)
        except ValueError:
            raise CliError(f"--value: the metric takes a number, got {text!r}") from None
    return text


@app.command()
@command
def feedback(metric: Annotated[str, typer.Option("--metric", help="a metric declared in config (feedback.metrics)")],
             value: Annotated[str, typer.Option("--value", help="true/false, a number, or text, as the metric takes")],
             request_id: Annotated[str | None, typer.Option("--request-id")] = None,
             episode_id: Annotated[str | None, typer.Option("--episode-id")] = None,
             feedback_id: Annotated[str | None, typer.Option("--feedback-id", help="idempotency: resend with "
                                                                                       "the same id")] = None,
             api_key: Annotated[str | None, typer.Option("--api-key", envvar="LLMPIPE_API_KEY")] = None,
             data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
             json: Json = False) -> None:
    """Give feedback on a request or an episode. Through the running stack's front door (checked at
    once: 403 for another tenant's request), else published to `feedback` (refusals: the DLQ)."""
    import httpx

    from pipeline.app.stack import running_stack
    from pipeline.contracts.feedback import Feedback

    s = _settings(data_dir, config, bootstrap)
    m = s.feedback.metric(metric)
    body = {k: v for k, v in {"request_id": request_id, "episode_id": episode_id, "metric": metric,
                              "value": parse_value(value, m.type if m else None),
                              "feedback_id": feedback_id}.items() if v is not None}
    key = _caller_key(s, api_key)
    info = running_stack(s.resolved_data_dir())
    if info is not None and info.http_url:
        r = httpx.post(f"{info.http_url}/v1/feedback", json=body, timeout=30,
                       headers={"Authorization": f"Bearer {key}"} if key else {})
        doc = r.json()
        if r.status_code != 200:
            raise CliError(f"feedback refused ({r.status_code} {doc['error']['code']}): {doc['error']['message']}")
        doc["via"] = "front door"
    else:
        import asyncio

        from pipeline.ingress.client import Client

        fb = Feedback.model_validate({**body, "api_key": key})
        bs, prefix = _stack_bootstrap(s)

        async def send() -> None:
            async with Client(bs, topic_prefix=prefix, security=s.kafka) as client:
                await client.send_feedback(fb)

        asyncio.run(send())
        doc = {"feedback_id": fb.feedback_id, "via": "kafka (the feedback worker checks it; refusals go to the DLQ)"}
    if not json:
        out.print(f"feedback {doc['feedback_id']} accepted via {doc['via']}")
    _print_json(doc)
