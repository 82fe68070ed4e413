"""`llmpipe --help`, `sql --help`, `submit --help` and `status` start without loading what only a
command's work needs (issue 36: each starts in under 2 s cold). Held by what the process imports, not
by a clock: each runs under `python -X importtime`, whose report names every module it loaded.

And the CLI as tests run it (tests/support/cli.py): in this process through typer's test runner, it
answers as the process does (exit code, stdout and stderr apart), also from inside a running loop."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.cli import in_process, llmpipe
from tests.support.paths import ROOT

# engines, models, the warehouse and the vector index: seconds of imports, gigabytes of memory
HEAVY = frozenset({"torch", "vllm", "transformers", "tokenizers", "sentence_transformers", "onnxruntime",
                   "presidio_analyzer", "spacy", "chdb", "qdrant_client", "numpy", "pandas", "pyarrow", "cv2", "PIL"})
# a help page only describes the commands: no settings, contracts, broker client, web stack or stack
NOT_FOR_HELP = HEAVY | {"pipeline.config", "pipeline.contracts", "pipeline.app.stack", "pipeline.stores",
                        "pydantic_settings", "aiokafka", "fastapi", "httpx", "clickhouse_connect", "yaml", "orjson"}


def run_importtime(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """`python -X importtime -m pipeline.cli ARGS`: the process and every module it imported."""
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "pipeline.cli", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    names = set()
    for line in r.stderr.splitlines():
        fields = line.removeprefix("import time:").split("|")
        if line.startswith("import time:") and len(fields) == 3 and fields[0].strip().isdigit():
            names.add(fields[2].strip())
    return r, names


def among(names: set[str], packages: frozenset[str] | set[str]) -> set[str]:
    """The imported modules that are one of `packages` or inside one."""
    return {n for n in names if any(n == p or n.startswith(p + ".") for p in packages)}


@pytest.mark.parametrize("args", [["--help"], ["sql", "--help"], ["submit", "--help"]], ids=" ".join)
def test_help_imports_only_the_cli(args):
    r, names = run_importtime(*args)
    assert r.returncode == 0 and "Usage:" in r.stdout, r.stderr[-2000:]
    assert {"typer", "pipeline.cli.common"} <= names, "the import report was read"
    loaded = among(names, NOT_FOR_HELP)
    assert not loaded, sorted(loaded)


def test_status_imports_no_engine_model_or_warehouse(tmp_path):
    r, names = run_importtime("status", "--data-dir", str(tmp_path))
    assert r.returncode == 1 and f"error: no stack is running for {tmp_path}" in r.stderr, r.stderr[-2000:]
    assert {"pipeline.app.stack", "pipeline.config.settings"} <= names, "status read its settings and the stack file"
    loaded = among(names, HEAVY)
    assert not loaded, sorted(loaded)


# no stack needed: failures (one line, a usage error), a help page on stdout
SAME_AS_THE_PROCESS = [("status",), ("submit", "--prompt", "x"), ("sql", "SELECT 1", "--format", "nope"),
                       ("sql", "--bogus"), ("sql", "--help"), ("tenants", "add", "not a name!")]


@pytest.mark.parametrize("args", SAME_AS_THE_PROCESS, ids=" ".join)
def test_the_in_process_cli_answers_as_the_process_does(args, tmp_path):
    assert in_process(args)
    here, child = llmpipe(*args, data_dir=tmp_path), llmpipe(*args, data_dir=tmp_path, subprocess=True)
    assert (here.returncode, here.stdout, here.stderr) == (child.returncode, child.stdout, child.stderr)
    assert child.stdout if args[-1] == "--help" else child.stderr and not child.stdout, child


async def test_the_in_process_cli_runs_its_own_loop_beside_a_running_one(tmp_path):
    """`tenants add` publishes with asyncio.run: on this loop's thread that would refuse to start."""
    r = llmpipe("tenants", "add", "acme", "--bootstrap", "127.0.0.1:1", data_dir=tmp_path)
    assert r.returncode == 1 and "Unable to bootstrap" in r.stderr, r.stderr[-2000:]
    assert "running event loop" not in r.stderr
