"""RL rollouts: submit prompts for n scored samples, export them for a trainer."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipeline.cli.app import rollouts_app
from pipeline.cli.common import (
    Bootstrap,
    CliError,
    ConfigFile,
    DataDir,
    Json,
    _caller_key,
    _print_json,
    _query_fn,
    _send_lines,
    _settings,
    _stack_bootstrap,
    command,
    out,
)

Tenants = Annotated[list[str] | None, typer.Option(
    "--tenant", help="read only this tenant's samples; repeatable (or --all-tenants)")]
AllTenants = Annotated[bool, typer.Option(
    "--all-tenants", help="read every tenant's samples: the operator's explicit choice")]


def _scope(tenant: list[str] | None, all_tenants: bool):
    """Whose samples to read: required, so that no read takes every tenant's rows by default."""
    from pipeline.training.samples import TenantScope

    try:
        return TenantScope.of(tenant, all_tenants)
    except ValueError as exc:
        raise CliError(str(exc)) from None


@rollouts_app.command("submit")
@command
def rollouts_submit(file: Annotated[Path, typer.Option("--file", exists=True, dir_okay=False, help="JSONL of prompts")],
                    n: Annotated[int, typer.Option("--n", min=1, max=64, help="samples per prompt")] = 4,
                    actor_revision: Annotated[str | None, typer.Option(
                        "--actor-revision", help="sample only from this actor revision (refused otherwise)")] = None,
                    dataset: Annotated[str | None, typer.Option(
                        "--dataset", help="the dataset's name (default: the file's name)")] = None,
                    dataset_revision: Annotated[str | None, typer.Option(
                        "--dataset-revision", help="default: NAME@sha256:<digest of the file's bytes>")] = None,
                    temperature: Annotated[float, typer.Option("--temperature", min=0)] = 1.0,
                    top_p: Annotated[float, typer.Option("--top-p", min=0, max=1)] = 1.0,
                    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1)] = 64,
                    seed: Annotated[int | None, typer.Option("--seed", help="sample i of a prompt uses seed + i")] = None,
                    verifier: Annotated[str | None, typer.Option(
                        "--verifier", help="exact_match (line field `expected`), regex (`pattern`), or a "
                                          "python:mod:fn the operator allows (generate's rollout_hooks)")] = None,
                    reward: Annotated[str | None, typer.Option(
                        "--reward", help="verified | length_penalty | an allowed python:mod:fn")] = None,
                    reward_arg: Annotated[list[str] | None, typer.Option("--reward-arg", help="NAME=NUMBER; repeatable")] = None,
                    concurrency: Annotated[int, typer.Option("--concurrency", min=1)] = 8,
                    api_key: Annotated[str | None, typer.Option("--api-key", envvar="LLMPIPE_API_KEY")] = None,
                    timeout: Annotated[float, typer.Option("--timeout")] = 300.0,
                    data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
                    json: Json = False) -> None:
    """Send every prompt as a `rollout` request; print what came back (samples, scores, actor revisions)."""
    from pipeline.training.samples import RolloutOptions, SampleTally, dataset_revision_of, rollout_doc

    args = {}
    for a in reward_arg or []:
        name, eq, value = a.partition("=")
        try:
            if not eq or not name.isidentifier():
                raise ValueError
            args[name] = float(value)
        except ValueError:
            raise CliError(f"--reward-arg: expected NAME=NUMBER, got {a!r}") from None
    s = _settings(data_dir, config, bootstrap)
    opts = RolloutOptions(n=n, actor_revision=actor_revision,
                          dataset_revision=dataset_revision or dataset_revision_of(file, dataset),
                          temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed, verifier=verifier,
                          reward=reward, reward_args=args, timeout_s=timeout, api_key=_caller_key(s, api_key))
    tally = SampleTally()
    summary = _send_lines(s, file, "rollouts", rate=None, concurrency=concurrency,
                          timeout_s=timeout, to_doc=lambda client, line: rollout_doc(client, line, opts),
                          on_response=tally.add)
    doc = {**summary.as_json(), **tally.as_json(), "run_id": opts.run_id, "dataset_revision": opts.dataset_revision}
    if not json:
        out.print(f"{doc['sent']} prompts: {doc['by_status']}; {doc['samples']} samples, {doc['verified']} verified, "
                  f"mean score {doc['mean_score']}; actor revisions {doc['actor_revisions']}")
    _print_json(doc)


@rollouts_app.command("export")
@command
def rollouts_export(out_file: Annotated[Path, typer.Option("--out", help="the file to write")],
                    format: Annotated[str, typer.Option("--format", help="parquet | jsonl")] = "parquet",
                    actor_revision: Annotated[str | None, typer.Option("--actor-revision")] = None,
                    dataset_revision: Annotated[str | None, typer.Option("--dataset-revision")] = None,
                    include_rejected: Annotated[bool, typer.Option(
                        "--include-rejected", help="also samples of rolled-back actor revisions (column `rejected`)")] = False,
                    from_feedback: Annotated[str | None, typer.Option(
                        "--from-feedback", help="METRIC[>=X]: served answers with this feedback, not rollouts")] = None,
                    tenant: Tenants = None, all_tenants: AllTenants = False,
                    data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
                    json: Json = False) -> None:
    """Write training-ready samples (the `training_samples` view: ids, logprobs, score, advantage),
    or with --from-feedback served answers with their feedback (the `training_candidates` view), of
    the tenants named with --tenant (or every tenant with --all-tenants)."""
    from pipeline.training.samples import EXPORT_FORMATS, export_rows, feedback_export_rows, feedback_selector, write_export

    if format not in EXPORT_FORMATS:
        raise CliError(f"--format must be one of {', '.join(EXPORT_FORMATS)}")
    scope = _scope(tenant, all_tenants)
    s = _settings(data_dir, config, bootstrap)
    if from_feedback is not None:
        try:
            metric, op, x = feedback_selector(from_feedback, s.feedback)
        except ValueError as exc:
            raise CliError(str(exc)) from None
        columns, rows = feedback_export_rows(_query_fn(s), metric, op, x, tenants=scope)
    else:
        columns, rows = export_rows(_query_fn(s), actor_revision, dataset_revision, include_rejected, tenants=scope)
    write_export(columns, rows, out_file, format)
    doc = {"rows": len(rows), "groups": len({r[columns.index("group_id")] for r in rows}), "path": str(out_file),
           "format": format}
    if not json:
        out.print(f"wrote {doc['rows']} samples in {doc['groups']} groups to {out_file}")
    _print_json(doc)


@rollouts_app.command("follow")
@command
def rollouts_follow(trainer: Annotated[str, typer.Option("--trainer", help="the consumer group is "
                                                                        "PREFIX.trainer.NAME")] = "trainer",
                    batch_groups: Annotated[int, typer.Option("--batch-groups", min=1)] = 8,
                    max_staleness: Annotated[int, typer.Option(
                        "--max-staleness", min=0, help="actor activations a sample may be behind the active one")] = 1,
                    stale: Annotated[str, typer.Option("--stale", help="drop | flag")] = "drop",
                    out_file: Annotated[Path | None, typer.Option(
                        "--out", help="append each batch's samples here (JSONL) before acknowledging it")] = None,
                    max_batches: Annotated[int | None, typer.Option("--max-batches", min=1)] = None,
                    tenant: Tenants = None, all_tenants: AllTenants = False,
                    data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
                    json: Json = False) -> None:
    """Consume rollouts as a trainer would: batches of complete, fresh sample groups of the tenants
    named (--tenant, or --all-tenants), acknowledged (committed) once written. Prints one line per
    acknowledged batch."""
    import asyncio
    import os

    import orjson

    from pipeline.training.stream import RolloutStream

    if stale not in ("drop", "flag"):
        raise CliError("--stale must be drop or flag")
    scope = _scope(tenant, all_tenants)
    s = _settings(data_dir, config, bootstrap)
    bs, prefix = _stack_bootstrap(s)

    async def run() -> int:
        done = 0
        async with RolloutStream(bs, prefix, trainer=trainer, batch_groups=batch_groups, max_staleness=max_staleness,
                                 stale=stale, security=s.kafka, tenants=scope) as stream:  # type: ignore[arg-type]
            async for batch in stream:
                if out_file is not None:
                    with open(out_file, "ab") as f:  # noqa: ASYNC230 - the CLI's own loop
                        for g in batch.groups:
                            for x in g.samples:
                                f.write(orjson.dumps({**x.model_dump(mode="json"), "stale": g.stale}) + b"\n")
                        f.flush()
                        os.fsync(f.fileno())
                await stream.ack(batch)
                doc = {"acked": batch.batch_id, "groups": [g.request_id for g in batch.groups],
                       "samples": len(batch.samples), "idle_ms": round(batch.idle_ms, 1),
                       "revisions": sorted({g.actor_revision for g in batch.groups}), "dropped": dict(stream.dropped)}
                print(orjson.dumps(doc).decode(), flush=True)
                done += 1
                if max_batches is not None and done >= max_batches:
                    break
        return done

    n = asyncio.run(run())
    if not json:
        out.print(f"{n} batches acknowledged", style="dim")
