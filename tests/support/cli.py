"""The CLI as a user runs it: `llmpipe ...` as a process, its JSON last line, and a stack that is
up for the length of a `with` block."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import yaml

from tests.support.paths import ROOT


def llmpipe(*args: str, data_dir, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args, "--data-dir", str(data_dir)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def last_json(proc: subprocess.CompletedProcess) -> Any:
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
