"""What every `llmpipe` command shares: the common options, error handling (one line on stderr, exit
1), settings loading, finding the running stack's broker, JSON output, publishing control records.
Sub-command modules (pipeline/cli_actor.py) import these; pipeline/cli.py assembles the app."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, Optional

import orjson
import typer
import yaml
from pydantic import ValidationError
from rich.console import Console

from pipeline.settings import Settings, load_settings

# a pipe or a CI log gets wide tables, not rich's 80-column default
out = Console(width=None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "150")))
err = Console(stderr=True)

DataDir = Annotated[Path, typer.Option("--data-dir", help="state directory", envvar="LLMPIPE_DATA_DIR")]
ConfigFile = Annotated[Optional[Path], typer.Option("--config", help="YAML settings (default ./llmpipe.yaml)")]
Bootstrap = Annotated[Optional[str], typer.Option("--bootstrap", help="HOST:PORT (default: the running stack)")]
Json = Annotated[bool, typer.Option("--json", help="print one JSON document as the last line")]

EXIT_ERROR = 1
EXIT_NOT_OK = 2  # the request was answered, but not with status ok


class CliError(Exception):
    pass


def _known_errors() -> tuple[type[BaseException], ...]:
    from pipeline.ingress.client import ClientTimeout
    from pipeline.replay import ReplayError
    from pipeline.runtime.broker import BrokerError
    from pipeline.runtime.errors import TopologyError
    from pipeline.stack import StackError
    from pipeline.stores.sql_gateway import SqlError
    from pipeline.stores.warehouse import WarehouseError

    return (CliError, StackError, BrokerError, TopologyError, SqlError, WarehouseError, ReplayError,
            ClientTimeout, FileNotFoundError, ValidationError, yaml.YAMLError)


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
            if isinstance(exc, ValidationError):
                msg = f"invalid settings: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}"
            sys.stderr.write(f"error: {msg}\n")
            raise typer.Exit(EXIT_ERROR) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None

    return wrapper


def _settings(data_dir: Path, config: Path | None, bootstrap: str | None = None, **extra: Any) -> Settings:
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
    from pipeline.stack import running_stack

    if s.bootstrap:
        return s.bootstrap, s.topic_prefix
    info = running_stack(s.resolved_data_dir())
    if info is None:
        raise CliError(f"no broker: no stack is running for {s.resolved_data_dir()} (llmpipe up) and no --bootstrap")
    return info.bootstrap, info.topic_prefix


def _print_json(doc: Any) -> None:
    sys.stdout.write(orjson.dumps(doc, default=str).decode() + "\n")
    sys.stdout.flush()


def _publish_control(bootstrap: str, prefix: str, records: list[tuple[str, Any]], topic: str = "control",
                     client_kwargs: dict[str, Any] | None = None) -> None:
    """Publish (key, record) pairs on `control` (or another registry topic), in order, acknowledged."""
    from aiokafka import AIOKafkaProducer

    from pipeline.runtime.codec import encode
    from pipeline.runtime.topics import TopicNames

    async def run() -> None:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, **(client_kwargs or {}))
        await p.start()
        try:
            for key, record in records:
                await p.send_and_wait(TopicNames(prefix)(topic), encode(record), key=key.encode())
        finally:
            await p.stop()

    asyncio.run(run())
