"""`make test` runs on two pytest-xdist workers (`-n 2 --dist loadgroup --no-loadscope-reorder`).

A measured run on one worker left the 2-core host idle about half the time (tests wait on stacks,
brokers and subprocesses), so a second worker costs little per test and halves what is left.

1. Every test gets an `xdist_group`: the users of a session stack share one group (one boot, on one
   worker); a package with package-scoped fixtures is one group; every other test file is a group of
   its own (its module fixtures boot once).
2. Groups are handed out heaviest first (the longest-processing-time rule), so neither worker is left
   alone with a long group at the end. The weights are the last measured clean-clone durations
   (docs/testing.md); a group not listed weighs 0.1 s a test (unit tests).
3. xdist's own `--dist loadgroup` puts the group into `item._nodeid`, which pytest 9 no longer reads
   (its node ids come from `item._id`): the groups never reached the scheduler and tests of one
   group ran on both workers (a second product stack, a second LoRA stack). So the workers write
   each test's group to a file the controller named (GROUPS_ENV), and the controller's scheduler
   (`pytest_xdist_make_scheduler`) reads the groups from there.
4. Without xdist (`make test-fast`, a single file) none of this changes what runs.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

GROUPS_ENV = "LLMPIPE_TEST_GROUPS"

# A session-scoped stack: every test that uses it runs in one group.
SESSION_STACKS = {"product_stack": "product"}
# Packages whose conftest has package-scoped fixtures.
PACKAGES = ("tests/security/",)
# Seconds per group from the last clean-clone run (pytest --durations, setup + call + teardown).
WEIGHT_S = {
    "product": 440,
    "tests/test_faults.py": 275,
    "tests/test_actor_serving.py": 240,
    "tests/test_demo.py": 110,
    "tests/test_mask_stack.py": 100,
    "tests/security/": 90,
    "tests/test_profile.py": 80,
    "tests/test_generate_deployments.py": 80,
    "tests/test_vllm_engine.py": 75,
    "tests/test_runtime_scale.py": 60,
    "tests/test_admit_state.py": 50,
    "tests/test_broker_roll.py": 75,
    "tests/test_training_stream.py": 40,
    "tests/test_route_replay.py": 40,
    "tests/test_cli_stack.py": 40,
    "tests/test_runtime_lifecycle.py": 35,
}


def group_of(item: pytest.Item) -> str:
    for fixture, group in SESSION_STACKS.items():
        if fixture in getattr(item, "fixturenames", ()):
            return group
    path = item.nodeid.split("::")[0]
    return next((p for p in PACKAGES if path.startswith(p)), path)


def _file_groups(items: list[pytest.Item]) -> dict[str, str]:
    """A file with one session-stack user goes whole into that stack's group (its module fixtures
    and the stack then live on the same worker)."""
    groups: dict[str, str] = {}
    for it in items:
        path, group = it.nodeid.split("::")[0], group_of(it)
        if path not in groups or group in SESSION_STACKS.values():
            groups[path] = group
    return groups


def _distributing(config: pytest.Config) -> bool:
    """The controller runs with --dist loadgroup; xdist starts its workers with dist "no" and
    option.loadgroup set."""
    if not config.pluginmanager.hasplugin("xdist"):
        return False
    return config.getoption("dist", "no") == "loadgroup" or bool(getattr(config.option, "loadgroup", False))


def pytest_configure(config: pytest.Config) -> None:
    """The controller (not a worker) names the file; the workers it starts inherit the name."""
    if _distributing(config) and not hasattr(config, "workerinput"):
        os.environ[GROUPS_ENV] = str(Path(tempfile.mkdtemp(prefix="llmpipe-test-groups-")) / "groups.json")


class GroupScheduling(LoadScopeScheduling):
    """xdist's scope scheduling, with a test's scope read from the groups the workers wrote."""

    _groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:
            self._groups = json.loads(Path(os.environ[GROUPS_ENV]).read_text())
        return self._groups.get(nodeid, nodeid)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> LoadScopeScheduling | None:
    return GroupScheduling(config, log) if _distributing(config) else None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _distributing(config):
        return
    groups = _file_groups(items)
    sizes: dict[str, int] = {}
    for it in items:
        g = groups[it.nodeid.split("::")[0]]
        sizes[g] = sizes.get(g, 0) + 1
    first_seen = {g: i for i, g in reversed(list(enumerate(groups[it.nodeid.split("::")[0]] for it in items)))}

    def heavier_first(it: pytest.Item) -> tuple[float, int]:
        g = groups[it.nodeid.split("::")[0]]
        return (-WEIGHT_S.get(g, sizes[g] / 10), first_seen[g])

    items.sort(key=heavier_first)  # stable: a group's own tests keep their order
    if GROUPS_ENV in os.environ:  # every worker collects the same; each writes it whole, atomically
        target = Path(os.environ[GROUPS_ENV])
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({it.nodeid: groups[it.nodeid.split("::")[0]] for it in items}))
        tmp.replace(target)
