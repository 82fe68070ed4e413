"""The CLI as a user runs it: `llmpipe ...` (in this process through typer's test runner where the
test is not about the process, else as a child process), its JSON last line, and a stack that is up
for the length of a `with` block."""

from __future__ import annotations

import contextlib
import logging
import subprocess as sp
import sys
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import yaml

from tests.support.paths import ROOT

PROG = f"{Path(sys.executable).name} -m pipeline.cli"

# Commands that only read files, talk to the broker or the admin endpoint and return: they run in
# this process (no ~1 s of imports per call). Everything else (up, down, worker, broker, serve,
# demo, models, profile, mask/cache evals, rollouts follow) starts or detaches long-lived processes,
# installs signal handlers, sets os.environ or loads models, and stays a child process.
IN_PROCESS: frozenset[tuple[str, ...]] = frozenset({
    ("sql",), ("submit",), ("status",), ("feedback",), ("report",), ("replay",), ("load",), ("plan",),
    ("tenants",), ("adapters",), ("actor",), ("blobs",), ("cache", "invalidate"), ("topics", "apply"),
    ("rollouts", "export"), ("rollouts", "submit"),
})
# `_settings` sets these loggers' levels (pipeline/cli/common.py); put back after each call
_QUIETED = ("aiokafka", "httpx", "presidio-analyzer")
# typer's runner swaps sys.stdout/stderr for the whole process: one in-process call at a time
_ONE_AT_A_TIME = threading.Lock()


def in_process(args: tuple[str, ...]) -> bool:
    return args[:1] in IN_PROCESS or args[:2] in IN_PROCESS


def llmpipe(*args: str, data_dir, timeout: float = 180, subprocess: bool = False) -> sp.CompletedProcess:
    """`llmpipe ARGS --data-dir DATA_DIR`: returncode, stdout and stderr (separate) as a user sees them.
    `subprocess=True` runs it as `python -m pipeline.cli` whatever the command (tests about the process)."""
    argv = [*args, "--data-dir", str(data_dir)]
    if subprocess or not in_process(args) or Path.cwd().resolve() != ROOT.resolve() or not _plain_consoles():
        return llmpipe_process(*argv, timeout=timeout)
    return _invoke(argv, timeout)


def llmpipe_in_process(*args: str, data_dir, timeout: float = 180) -> sp.CompletedProcess:
    """`llmpipe ARGS` in this process whatever the command: for a test that has the command's models
    loaded already (the eval contracts) and is not about the process."""
    return _invoke([*args, "--data-dir", str(data_dir)], timeout, wait=True)


def llmpipe_process(*argv: str, timeout: float = 180) -> sp.CompletedProcess:
    return sp.run([sys.executable, "-m", "pipeline.cli", *argv], cwd=ROOT, capture_output=True, text=True,
                  timeout=timeout)


def _plain_consoles() -> bool:
    """The CLI's rich consoles pick colour once, at import: a terminal then (pytest -s) would put
    escape codes in the output a child process writes plain."""
    from pipeline.cli.common import err, out

    return out.color_system is None and err.color_system is None


def _invoke(argv: list[str], timeout: float, wait: bool = False) -> sp.CompletedProcess:
    """Run in a worker thread (holding _ONE_AT_A_TIME, released when it ends): its asyncio.run never
    meets the caller's running loop, as a child process's would not."""
    from typer.testing import CliRunner

    from pipeline.cli import app

    if not _ONE_AT_A_TIME.acquire(timeout=timeout if wait else -1, blocking=wait):
        if wait:
            raise sp.TimeoutExpired([PROG, *argv], timeout)
        return llmpipe_process(*argv, timeout=timeout)  # another thread's call holds the streams
    done: dict[str, Any] = {}

    def run() -> None:
        root = logging.getLogger()
        saved = root.handlers[:], root.level, {n: logging.getLogger(n).level for n in _QUIETED}
        # a fresh process has no root handler: `_settings`'s basicConfig then logs to (captured) stderr
        root.handlers = []
        try:
            done["result"] = CliRunner().invoke(app, argv, prog_name=PROG)
        except BaseException as exc:
            done["error"] = exc
        finally:
            root.handlers, level, quieted = saved
            root.setLevel(level)
            for name, lvl in quieted.items():
                logging.getLogger(name).setLevel(lvl)
            _ONE_AT_A_TIME.release()

    worker = threading.Thread(target=run, name=f"llmpipe {argv[0]}", daemon=True)
    try:
        worker.start()
    except BaseException:
        _ONE_AT_A_TIME.release()
        raise
    worker.join(timeout)
    if worker.is_alive():  # a thread cannot be killed: later calls run as processes until it ends
        raise sp.TimeoutExpired([PROG, *argv], timeout)
    if "error" in done:
        raise done["error"]
    r = done["result"]
    stderr = r.stderr
    if r.exception is not None and not isinstance(r.exception, SystemExit) and r.exc_info is not None:
        stderr += "".join(traceback.format_exception(*r.exc_info))  # what the interpreter would print
    return sp.CompletedProcess([PROG, *argv], r.exit_code, r.stdout, stderr)


def last_json(proc: sp.CompletedProcess) -> Any:
    return orjson.loads(proc.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def running(config: dict, data_dir: Path, *up_args: str) -> Iterator[dict]:
    """`llmpipe up --detach` on `config` (written to DATA_DIR/llmpipe.yaml); its stack info; down."""
    cfg = data_dir / "llmpipe.yaml"
    cfg.write_text(yaml.safe_dump(config))
    up = llmpipe("up", "--detach", *up_args, "--config", str(cfg), "--json", data_dir=data_dir, timeout=600)
    assert up.returncode == 0, up.stderr
    try:
        yield last_json(up)
    finally:
        assert llmpipe("down", data_dir=data_dir, timeout=180).returncode == 0


__all__ = ["IN_PROCESS", "in_process", "last_json", "llmpipe", "llmpipe_in_process", "llmpipe_process", "running"]
