"""Send requests: submit one, load a traffic file, try the masker on a sample."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from pipeline.cli.app import app
from pipeline.cli.common import (
    EXIT_NOT_OK,
    Bootstrap,
    CliError,
    ConfigFile,
    DataDir,
    Json,
    _caller_key,
    _local_signer,
    _print_json,
    _progress,
    _send_lines,
    _settings,
    _stack_bootstrap,
    _stack_doorbell,
    _stage_policy,
    command,
    out,
)

# ---- callers -----------------------------------------------------------------------------------


def _image_arg(value: str) -> str:
    """A local file becomes a data URL (media sniffs the real type from the bytes); anything else is a URL."""
    import base64
    import mimetypes

    path = Path(value).expanduser()
    if "://" in value or value.startswith("data:") or not path.is_file():
        return value
    mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()}"


@app.command()
@command
def submit(prompt: Annotated[str, typer.Option("--prompt", help="the user message")],
           image: Annotated[list[str] | None, typer.Option(
               "--image", help="image URL or local file (sent inline as a data URL); repeatable")] = None,
           api_key: Annotated[str | None, typer.Option("--api-key", envvar="LLMPIPE_API_KEY")] = None,
           model: Annotated[str | None, typer.Option("--model")] = None,
           max_tokens: Annotated[int | None, typer.Option("--max-tokens")] = None,
           seed: Annotated[int | None, typer.Option("--seed")] = None,
           idempotency_key: Annotated[str | None, typer.Option("--idempotency-key")] = None,
           tenant: Annotated[str | None, typer.Option("--tenant", help="tenant id (tests; keys map to tenants)")] = None,
           timeout: Annotated[float, typer.Option("--timeout", help="seconds to wait (also the deadline)")] = 60.0,
           stream: Annotated[bool, typer.Option("--stream", help="print the answer as it is generated (with "
                                                                  "--json: one {\"piece\": ...} line each)")] = False,
           data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
           json: Json = False) -> None:
    """Send one request and print its terminal answer (exit 2 when the status is not ok). Ctrl-C
    while streaming cancels the request."""
    import asyncio

    from pipeline.contracts.request import ChatBody, ChatMessage
    from pipeline.ingress.client import Client

    s = _settings(data_dir, config, bootstrap)
    bs, prefix = _stack_bootstrap(s)
    body = ChatBody(messages=[ChatMessage(role="user", content=prompt)], model=model, max_tokens=max_tokens,
                    seed=seed, images=[_image_arg(i) for i in image or []])

    async def run() -> Any:
        async with Client(bs, topic_prefix=prefix, security=s.kafka, doorbell_dir=_stack_doorbell(s)) as client:
            client.sign = _local_signer(s)  # the key stays off `requests` (issue 35, low 15)
            doc = client.build(body=body, timeout_s=timeout, api_key=_caller_key(s, api_key, tenant),
                               idempotency_key=idempotency_key, tenant_id=tenant)
            if not stream:
                return await client.request(doc, timeout + 5), None
            from pipeline.security.sealing import keyring_for  # the operator's CLI: opens sealed deltas

            client.delta_keyring = keyring_for(s)
            return await _print_stream(client, doc, timeout + 5, json)

    resp, streamed = asyncio.run(run())
    answer = {k: v for k, v in resp.model_dump(mode="json").items() if k in {
        "request_id", "status", "text", "error_class", "reason", "route", "model", "adapter", "cache", "usage", "timings"}}
    if streamed is not None:
        answer["stream"] = streamed
    if json:
        _print_json(answer)
    else:
        out.print(f"[bold]{resp.status.value}[/] {resp.request_id}")
        if resp.text is not None and streamed is None:
            out.print(resp.text, markup=False, highlight=False)
    if resp.status.value != "ok":
        sys.stderr.write(f"{resp.status.value}: {resp.error_class}: {resp.reason}\n")
        raise typer.Exit(EXIT_NOT_OK)


async def _print_stream(client, doc, timeout_s: float, as_json: bool) -> tuple[Any, dict[str, Any]]:
    """Print each piece as it comes; the terminal answer and how the stream went."""
    import time

    import orjson

    from pipeline.ingress.stream_follow import Ended

    t0, first_ms, pieces = time.perf_counter(), None, 0
    async for ev in client.stream(doc, timeout_s):
        if isinstance(ev, Ended):
            if not as_json:
                sys.stdout.write("\n")
            return ev.response, {"pieces": pieces, "first_piece_ms": first_ms, "error": ev.error}
        if ev.text:
            pieces += 1
            first_ms = first_ms if first_ms is not None else round((time.perf_counter() - t0) * 1000, 1)
            sys.stdout.write(orjson.dumps({"piece": ev.text}).decode() + "\n" if as_json else ev.text)
            sys.stdout.flush()
    raise RuntimeError("the stream ended without an answer")


@app.command()
@command
def load(file: Annotated[Path, typer.Option("--file", exists=True, dir_okay=False, help="JSONL of chat bodies")],
         rate: Annotated[float | None, typer.Option("--rate", help="requests per second (default: as fast as allowed)")] = None,
         concurrency: Annotated[int, typer.Option("--concurrency", min=1)] = 32,
         api_key: Annotated[str | None, typer.Option("--api-key", envvar="LLMPIPE_API_KEY")] = None,
         timeout: Annotated[float, typer.Option("--timeout")] = 120.0,
         data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
         json: Json = False) -> None:
    """Send a traffic file and print {sent, by_status, by_error_class, latency_ms}."""
    s = _settings(data_dir, config, bootstrap)
    summary = _send_lines(s, file, "load", rate=rate, concurrency=concurrency, timeout_s=timeout,
                          api_key=_caller_key(s, api_key))
    doc = summary.as_json()
    if not json:
        out.print(f"sent {doc['sent']}: {doc['by_status']} latency {doc['latency_ms']}")
    _print_json(doc)


@app.command()
@command
def mask(text: Annotated[str, typer.Option("--text", help="a sample to mask")],
         tenant: Annotated[str | None, typer.Option("--tenant", help="apply this tenant's overrides")] = None,
         data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
         json: Json = False) -> None:
    """Mask a sample with the configured policy: the masked text and entity types (never the mapping)."""
    from pipeline.stages.mask.config import MaskStagePolicy
    from pipeline.stages.mask.pii import Masker

    policy = _stage_policy(_settings(data_dir, config, bootstrap), "mask", MaskStagePolicy)
    masker = Masker(policy.for_tenant(tenant))
    result = masker.mask([text])
    doc = {"masked_text": result.texts[0], "entities": dict(result.counts), "policy_version": policy.version,
           "engine_revision": masker.revision}
    if json:
        _print_json(doc)
    else:
        out.print(result.texts[0], markup=False, highlight=False)
        out.print(", ".join(f"{k}: {v}" for k, v in sorted(result.counts.items())) or "no entities found")


@app.command("mask-eval")
@command
def mask_eval(file: Annotated[Path, typer.Option("--file", exists=True, dir_okay=False, help="labelled JSONL")],
              tenant: Annotated[str | None, typer.Option("--tenant", help="apply this tenant's overrides")] = None,
              data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
              json: Json = False) -> None:
    """Recall per PII type, false-positive rate on negatives and ms per request of the configured mask policy."""
    from rich.table import Table

    from pipeline.evaluation.mask import evaluate, read_sentences
    from pipeline.stages.mask.config import MaskStagePolicy
    from pipeline.stages.mask.pii import Masker

    policy = _stage_policy(_settings(data_dir, config, bootstrap), "mask", MaskStagePolicy)
    try:
        rows = read_sentences(file)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    masker = Masker(policy.for_tenant(tenant))
    progress, advance = _progress("mask-eval", len(rows))
    with progress:
        report = evaluate(masker, rows, on_row=advance)
    report["engine_revision"] = masker.revision
    if not json:
        t = Table("type", "values", "caught", "recall")
        for kind, r in report["recall"].items():
            t.add_row(kind, str(r["values"]), str(r["caught"]), str(r["recall"]))
        out.print(t)
        out.print(f"false positives: {report['false_positives']} of {report['negatives']} negatives "
                  f"({report['false_positive_rate']}); ms per request p50 {report['ms_per_request']['p50']} "
                  f"p95 {report['ms_per_request']['p95']}")
    _print_json(report)




