"""What every `llmpipe` command shares: the common options, error handling (one line on stderr, exit
1), settings loading, finding the running stack's broker, JSON output, publishing control records.
Every sub-command module of pipeline/cli/ imports these; pipeline/cli/__init__.py assembles the app.
Imports that cost are made where they are used: `llmpipe --help` and `status` start in well under
2 s (tests/test_cli_startup.py holds the heavy ones out)."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from datetime import UTC
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

if TYPE_CHECKING:
    from datetime import datetime

    from rich.progress import Progress

    from pipeline.config.settings import Settings

# a pipe or a CI log gets wide tables, not rich's 80-column default
out = Console(width=None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "150")))
err = Console(stderr=True)

DataDir = Annotated[Path, typer.Option("--data-dir", help="state directory", envvar="LLMPIPE_DATA_DIR")]
ConfigFile = Annotated[Path | None, typer.Option("--config", help="YAML settings (default ./llmpipe.yaml)")]
Bootstrap = Annotated[str | None, typer.Option("--bootstrap", help="HOST:PORT (default: the running stack)")]
Json = Annotated[bool, typer.Option("--json", help="print one JSON document as the last line")]

EXIT_ERROR = 1
EXIT_NOT_OK = 2  # the request was answered, but not with status ok


class CliError(Exception):
    pass


# (module, class) of the failures a command reports in one line
KNOWN_ERRORS = (("pipeline.app.stack", "StackError"), ("pipeline.runtime.broker.embedded", "BrokerError"),
                ("pipeline.runtime.errors", "TopologyError"), ("pipeline.stores.sql_gateway", "SqlError"),
                ("pipeline.stores.warehouse", "WarehouseError"), ("pipeline.analysis.replay", "ReplayError"),
                ("pipeline.ingress.client", "ClientTimeout"), ("pydantic_core", "ValidationError"),
                ("yaml", "YAMLError"))


def _known_errors() -> tuple[type[BaseException], ...]:
    """Those of KNOWN_ERRORS whose module is loaded: an exception's class is loaded before it can be
    raised, and importing them all would cost a failing command half a second."""
    loaded = (getattr(sys.modules[m], name) for m, name in KNOWN_ERRORS if m in sys.modules)
    return (CliError, FileNotFoundError, *loaded)


def _is_validation_error(exc: BaseException) -> bool:
    core = sys.modules.get("pydantic_core")
    return core is not None and isinstance(exc, core.ValidationError)


def command(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Known failures end as one line on stderr and exit 1, never as a traceback."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except _known_errors() as exc:
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if _is_validation_error(exc):
                msg = f"invalid settings: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}"
            sys.stderr.write(f"error: {msg}\n")
            raise typer.Exit(EXIT_ERROR) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None

    return wrapper


def _settings(data_dir: Path, config: Path | None, bootstrap: str | None = None, **extra: Any) -> Settings:
    from pipeline.config.settings import load_settings

    s = load_settings(config, bootstrap=bootstrap, **extra)
    # --data-dir wins over the file unless left at its default
    if data_dir != Path(".llmpipe") or "data_dir" not in s.model_fields_set:
        s = s.model_copy(update={"data_dir": data_dir})
    logging.basicConfig(level=s.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("presidio-analyzer").setLevel(logging.WARNING)
    return s


def _stack_bootstrap(s: Settings) -> tuple[str, str]:
    """(bootstrap, topic prefix): explicit settings first, then the running embedded stack."""
    from pipeline.app.stack import running_stack

    if s.bootstrap:
        return s.bootstrap, s.topic_prefix
    info = running_stack(s.resolved_data_dir())
    if info is None:
        raise CliError(f"no broker: no stack is running for {s.resolved_data_dir()} (llmpipe up) and no --bootstrap")
    return info.bootstrap, info.topic_prefix


def _stack_doorbell(s: Settings) -> Path | None:
    """The doorbell dir a client of this stack rings and dozes in: configured, else the running
    embedded stack's (runtime/wakeup/doorbell.py); None talks to the broker without hints."""
    from pipeline.app.stack import running_stack

    if s.doorbell_dir or s.bootstrap:
        return s.doorbell_dir
    info = running_stack(s.resolved_data_dir())
    return Path(info.doorbell_dir) if info is not None and info.doorbell_dir else None


def _print_json(doc: Any) -> None:
    import orjson

    sys.stdout.write(orjson.dumps(doc, default=str).decode() + "\n")
    sys.stdout.flush()


def _publish_control(bootstrap: str, prefix: str, records: list[tuple[str, Any]], topic: str = "control",
                     settings: Settings | None = None) -> None:
    """Publish (key, record) pairs on `control` (or another registry topic), in order, acknowledged.
    With the stack's doorbell each send rings the followers, so the change applies at once rather
    than at their next doze timeout (up to a second; runtime/follow/follower.py)."""
    import asyncio

    from pipeline.runtime.codec import encode
    from pipeline.runtime.topics import TopicNames
    from pipeline.runtime.wakeup.doorbell import producer_class

    kwargs = settings.kafka.client_kwargs() if settings is not None else {}
    cls, extra = producer_class(_stack_doorbell(settings) if settings is not None else None)

    async def run() -> None:
        p = cls(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, **kwargs, **extra)
        await p.start()
        try:
            for key, record in records:
                await p.send_and_wait(TopicNames(prefix)(topic), encode(record), key=key.encode())
        finally:
            await p.stop()

    asyncio.run(run())


def _query_fn(s: Settings) -> Callable[[str, dict[str, Any]], Any]:
    """Route SQL to the owner of the warehouse: the running stack's admin endpoint, or directly."""
    from pipeline.app.stack import running_stack
    from pipeline.ingress.admin import warehouse_query

    info = running_stack(s.resolved_data_dir())
    return warehouse_query(s, info.admin_url if info is not None else None)



def parse_since(text: str) -> datetime:
    from datetime import datetime, timedelta

    try:
        return datetime.now(UTC) - timedelta(milliseconds=parse_duration_ms(text))
    except CliError:
        pass
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise CliError(f"--since: expected a duration (30m, 2h, 7d) or an ISO time, got {text!r}") from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)



def parse_duration_ms(text: str) -> int:
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*", text)
    if not m:
        raise CliError(f"expected a duration like 90s, 30m, 2h or 7d, got {text!r}")
    return int(float(m.group(1)) * {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}[m.group(2)])


def _caller_key(s: Settings, api_key: str | None, tenant: str | None = None) -> str | None:
    """--api-key, else the development key `llmpipe up` made in the data dir (not when a tenant is
    named: a trusted producer's request carries no key)."""
    from pipeline.app.dev_key import read_dev_key

    return api_key if api_key or tenant else read_dev_key(s.resolved_data_dir())


def _local_signer(s: Settings) -> Callable[[Any], Any] | None:
    """Issue 35, low 15: talking to the stack `llmpipe up` runs on this data dir, the CLI holds the
    keyring door and mask share, so it signs a caller assertion like the door and the key stays
    off `requests`. A key it cannot place (issued on `control`) travels as before; mask checks
    either. None: another broker (--bootstrap), whose keyring this data dir may not have."""
    from pipeline.app.dev_key import read_dev_key
    from pipeline.app.stack import running_stack
    from pipeline.registries.tenants import Caller, TenantRegistry, key_hash, key_id
    from pipeline.security.caller_assertion import sign
    from pipeline.security.sealing import keyring_for

    if s.bootstrap or running_stack(s.resolved_data_dir()) is None:
        return None
    keyring, registry = keyring_for(s), TenantRegistry(s.tenants, s.tenant_defaults)
    dev = read_dev_key(s.resolved_data_dir())

    def signed(doc: Any) -> Any:
        if doc.api_key is None or doc.caller_assertion is not None:
            return doc
        caller = registry.authenticate(doc.api_key)
        if caller is None and doc.api_key == dev and s.auth.dev_tenant:  # dev_key.py issues it so
            caller = Caller(s.auth.dev_tenant, "dev", ("rollouts",), key_id(key_hash(dev)))
        if caller is None or doc.tenant_id not in (None, caller.tenant):
            return doc
        bare = doc.model_copy(update={"api_key": None, "tenant_id": caller.tenant})
        return bare.model_copy(update={"caller_assertion": sign(bare, caller, keyring)})
    return signed


def _stage_policy(s: Settings, stage: str, model: Any) -> Any:
    """The configured policy of `stage` as `model` (a pydantic model): its defaults when the
    topology has no such stage."""
    spec = next((st for st in s.stages if st.name == stage), None)
    return model.model_validate(spec.policy if spec else {})


def _progress(label: str, total: int) -> tuple[Progress, Callable[[], None]]:
    """A transient progress bar on stderr and the callback that advances it (use the bar as a
    context manager)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err,
                        transient=True)
    task = progress.add_task(label, total=total)
    return progress, lambda: progress.advance(task)


def _send_lines(s: Settings, file: Path, label: str, **run_load_args: Any) -> Any:
    """A JSONL file through `run_load` with a progress bar; invalid lines are reported on stderr.
    `to_doc`, if given, takes the started client and a line (`rollouts submit` builds rollouts)."""
    import asyncio

    from pipeline.ingress.client import Client
    from pipeline.ingress.load import read_traffic, run_load

    bs, prefix = _stack_bootstrap(s)
    lines, bad = read_traffic(file)
    make_doc = run_load_args.pop("to_doc", None)

    async def run() -> Any:
        progress, advance = _progress(label, len(lines))
        with progress:
            async with Client(bs, topic_prefix=prefix, security=s.kafka, doorbell_dir=_stack_doorbell(s)) as client:
                client.sign = _local_signer(s)
                to_doc = (lambda line: make_doc(client, line)) if make_doc else None
                return await run_load(client, lines, on_done=advance, to_doc=to_doc, **run_load_args)

    summary = asyncio.run(run())
    summary.invalid_lines = bad + summary.invalid_lines
    for inv in summary.invalid_lines[:20]:
        err.print(f"line {inv.line_no}: {inv.reason}", markup=False, highlight=False)
    return summary
