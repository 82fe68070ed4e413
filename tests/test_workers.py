"""`make test`'s two workers keep each group on one worker (tests/support/workers.py). xdist's own
loadgroup did not under pytest 9 (the group went into a node-id field pytest no longer reads): a
session stack then booted once per worker. Checked with a nested run on a scratch suite."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict

from tests.support.paths import ROOT

CONFTEST = """
import os, json, pytest
pytest_plugins = ["tests.support.workers"]

@pytest.fixture(scope="session")
def product_stack():
    return os.getpid()

@pytest.fixture(autouse=True)
def _where(request):
    yield
    with open(os.environ["WHERE"], "a") as f:
        f.write(json.dumps([request.node.nodeid, os.environ.get("PYTEST_XDIST_WORKER")]) + "\\n")
"""
FILE = """
import pytest
@pytest.mark.parametrize("i", range(6))
def test_{name}(i{extra}):
    pass
"""


def test_each_group_runs_on_one_worker(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for name, extra in (("a", ""), ("b", ""), ("c", ", product_stack"), ("d", ", product_stack")):
        (tmp_path / f"test_{name}.py").write_text(FILE.format(name=name, extra=extra))
    where = tmp_path / "where.jsonl"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist",
                          "loadgroup", "--no-loadscope-reorder", str(tmp_path)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env={**__import__("os").environ, "WHERE": str(where),
                                                      "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    workers: dict[str, set[str]] = defaultdict(set)
    for line in where.read_text().splitlines():
        nodeid, worker = json.loads(line)
        f = nodeid.split("::")[0].rsplit("/", 1)[-1]
        workers["product" if f in ("test_c.py", "test_d.py") else f].add(worker)
    assert len([w for ws in workers.values() for w in ws]) == len(workers) == 3, dict(workers)
    assert set().union(*workers.values()) == {"gw0", "gw1"}, "both workers got work"
