"""`llmpipe actor prepare|activate|rollback|status`: the operator's (or trainer's) side of the actor
weight lifecycle. `activate` is the barrier: it publishes the activation only once every generate
replica reported the revision validated, and returns once every replica reported it active (applied:
a rollout request sent after it returns samples the new revision, on whichever replica takes it)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pipeline.cli.common import (
    Bootstrap,
    CliError,
    ConfigFile,
    DataDir,
    Json,
    _print_json,
    _publish_control,
    _settings,
    _stack_bootstrap,
    command,
    out,
)

if TYPE_CHECKING:
    from pipeline.config.settings import Settings
    from pipeline.contracts import WeightEvent
    from pipeline.registries.actor import ActorBook

actor_app = typer.Typer(no_args_is_help=True,
                        help="The RL actor's weights (a LoRA adapter): prepare, activate (barrier), rollback, status.")
OPERATOR = "operator"


def _book(boot: str, prefix: str, s: Settings) -> ActorBook:
    import asyncio

    from pipeline.registries.actor import ActorBook
    from pipeline.runtime.follow.follower import ControlFollower
    from pipeline.runtime.topics import TopicNames

    book = ActorBook()

    async def run() -> None:
        f = await ControlFollower(boot, TopicNames(prefix)("control"), book.apply, s.kafka).start()
        await f.stop()

    asyncio.run(run())
    return book


def _event(revision: str, transition: str, detail: str) -> tuple[str, WeightEvent]:
    from pipeline.contracts import WeightEvent
    from pipeline.contracts.actor import ACTOR_ADAPTER

    return ACTOR_ADAPTER, WeightEvent(replica=OPERATOR, kind="actor", name=ACTOR_ADAPTER, revision=revision,
                                      transition=transition, detail=detail)


@actor_app.command("prepare")
@command
def actor_prepare(revision: Annotated[str, typer.Argument(help="the new actor revision, e.g. step-1200")],
                  path: Annotated[Path, typer.Option("--path", exists=True, file_okay=False, help="LoRA adapter directory")],
                  rank: Annotated[int, typer.Option("--rank", min=1)],
                  validation: Annotated[Path | None, typer.Option(
                      "--validation", exists=True, dir_okay=False,
                      help='JSONL of {"prompt", "expected", "match": exact|prefix|regex}: greedy answers it must give')] = None,
                  base_model: Annotated[str, typer.Option("--base-model")] = "smollm2-135m-instruct",
                  data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
                  json: Json = False) -> None:
    """Verify the weights (allowed root, rank, checksum) and announce them: every replica loads and validates."""
    import orjson

    from pipeline.contracts.actor import ActorPrepared, ActorSpec, ValidationPrompt
    from pipeline.registries.adapters import adapter_digest, incompatibility

    s = _settings(data_dir, config, bootstrap)
    checks = [ValidationPrompt.model_validate(orjson.loads(line)) for line in
              (validation.read_bytes().splitlines() if validation else []) if line.strip()]
    spec = ActorSpec(revision=revision, base_model=base_model, path=path.resolve(), sha256=adapter_digest(path),
                     rank=rank, validation=checks)
    problem = incompatibility(spec.adapter(), s.lora)
    if problem is not None:
        raise CliError(f"actor {revision} refused: {problem}")
    boot, prefix = _stack_bootstrap(s)
    if revision in _book(boot, prefix, s).rejected:
        raise CliError(f"actor {revision} was rejected before; prepare it under a new revision")
    _publish_control(boot, prefix, [(f"actor:{revision}", ActorPrepared(spec=spec))], settings=s)
    _publish_control(boot, prefix, [_event(revision, "prepared", f"{spec.sha256[:12]}, {len(checks)} checks")],
                     topic="weight_events", settings=s)
    doc = {"revision": revision, "sha256": spec.sha256, "validation_prompts": len(checks)}
    _print_json(doc) if json else out.print(f"prepared {revision} ({spec.sha256[:12]}); replicas now load and validate it")


@actor_app.command("activate")
@command
def actor_activate(revision: Annotated[str, typer.Argument()],
                   replicas: Annotated[int | None, typer.Option(
                       "--replicas", min=1,
                       help="generate replicas that must validate it (default: the local stack's 1)")] = None,
                   timeout: Annotated[float, typer.Option("--timeout", help="seconds to wait for the barrier")] = 300.0,
                   data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
                   json: Json = False) -> None:
    """Wait until every replica validated the revision, then activate it (new batches only)."""
    from pipeline.contracts.actor import ActorActivated

    s = _settings(data_dir, config, bootstrap)
    boot, prefix = _stack_bootstrap(s)
    if replicas is None:
        if s.bootstrap:
            raise CliError("--replicas: how many generate replicas must validate the revision")
        replicas = 1  # `llmpipe up` runs one generate worker
    deadline = time.monotonic() + timeout
    while True:
        book = _book(boot, prefix, s)
        ready, why = book.barrier(revision, replicas)
        if ready:
            break
        if "rejected" in why or "never prepared" in why:
            raise CliError(f"actor {revision} cannot be activated: {why}")
        if time.monotonic() > deadline:
            raise CliError(f"actor {revision}: barrier not reached within {timeout:.0f}s ({why})")
        time.sleep(1.0)
    if book.active == revision:
        raise CliError(f"actor {revision} is already active")
    previous = book.active
    _publish_control(boot, prefix, [(f"actor:{revision}", ActorActivated(revision=revision, previous=previous,
                                                                          reason=why))], settings=s)
    while not (switched := _book(boot, prefix, s).switched(revision, replicas))[0]:
        if time.monotonic() > deadline:  # published: the replicas that apply it late still switch
            raise CliError(f"actor {revision} was activated, but {switched[1]} within {timeout:.0f}s: "
                           "replicas that have not applied it still sample the previous revision")
        time.sleep(0.5)
    doc = {"revision": revision, "previous": previous, "barrier": why, "switched": switched[1]}
    _print_json(doc) if json else out.print(f"activated {revision} (was {previous}): {why}; {switched[1]}")


@actor_app.command("rollback")
@command
def actor_rollback(reason: Annotated[str, typer.Option("--reason")] = "rolled back by the operator",
                   data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
                   json: Json = False) -> None:
    """Reject the active revision (its samples are marked in `training_samples`) and re-activate the one before."""
    from pipeline.contracts.actor import ActorActivated, ActorRejected

    s = _settings(data_dir, config, bootstrap)
    boot, prefix = _stack_bootstrap(s)
    book = _book(boot, prefix, s)
    current = book.active
    if current is None:
        raise CliError("no actor revision is active")
    target = book.rollback_target()
    book.rejected[current] = reason
    _publish_control(boot, prefix, [(f"actor:{current}", ActorRejected(revision=current, reason=reason)),
                                    (f"actor:{target}", ActorActivated(revision=target, previous=current,
                                                                       reason=f"rollback from {current}: {reason}"))], settings=s)
    _publish_control(boot, prefix, [_event(current, "rejected", reason)], topic="weight_events", settings=s)
    doc = {"rejected": current, "active": target}
    _print_json(doc) if json else out.print(f"rejected {current}; active now {target or 'the base model'}")


@actor_app.command("status")
@command
def actor_status(data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
                 json: Json = False) -> None:
    """Every prepared revision: active / rejected, and each replica's last report."""
    from rich.table import Table

    s = _settings(data_dir, config, bootstrap)
    book = _book(*_stack_bootstrap(s), s)
    rows = [{"revision": rev, "active": rev == book.active, "rejected": book.rejected.get(rev),
             "replicas": book.reports.get(rev, {})} for rev in book.prepared]
    if json:
        _print_json({"active": book.active, "revisions": rows})
        return
    t = Table("revision", "active", "rejected", "replicas")
    for r in rows:
        t.add_row(r["revision"], "yes" if r["active"] else "", r["rejected"] or "",
                  ", ".join(f"{k}: {v}" for k, v in r["replicas"].items()))
    out.print(t)
