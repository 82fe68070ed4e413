"""`make test` runs on two pytest-xdist workers (`-n 2 --dist loadgroup --no-loadscope-reorder`).

A measured run on one worker left the 2-core host idle about half the time (tests wait on stacks,
brokers and subprocesses), so a second worker costs little per test and halves what is left.

1. Every test gets an `xdist_group`: the users of a session stack share one group (one boot, on one
   worker); a package with package-scoped fixtures is one group; every other test file is a group of
   its own (its module fixtures boot once).
2. Groups are handed out heaviest first (the longest-processing-time rule), so neither worker is left
   alone with a long group at the end. The weights are the last measured clean-clone durations
   (docs/testing.md); a group not listed weighs 0.1 s a test (unit tests).
3. Without xdist (`make test-fast`, a single file) none of this changes what runs.
"""

from __future__ import annotations

import pytest

# A session-scoped stack: every test that uses it runs in one group.
SESSION_STACKS = {"product_stack": "product"}
# Packages whose conftest has package-scoped fixtures.
PACKAGES = ("tests/security/",)
# Seconds per group from the last clean-clone run (pytest --durations, setup + call + teardown).
WEIGHT_S = {
    "product": 420,
    "tests/test_faults.py": 260,
    "tests/test_actor_serving.py": 240,
    "tests/test_demo.py": 110,
    "tests/test_mask_stack.py": 100,
    "tests/security/": 90,
    "tests/test_profile.py": 80,
    "tests/test_generate_deployments.py": 80,
    "tests/test_vllm_engine.py": 75,
    "tests/test_runtime_scale.py": 60,
    "tests/test_admit_state.py": 50,
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


@pytest.hookimpl(tryfirst=True)  # before xdist appends the group to each node id
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist") or config.getoption("dist", "no") != "loadgroup":
        return
    groups = _file_groups(items)
    sizes: dict[str, int] = {}
    for it in items:
        g = groups[it.nodeid.split("::")[0]]
        it.add_marker(pytest.mark.xdist_group(g))
        sizes[g] = sizes.get(g, 0) + 1
    first_seen = {g: i for i, g in reversed(list(enumerate(groups[it.nodeid.split("::")[0]] for it in items)))}

    def heavier_first(it: pytest.Item) -> tuple[float, int]:
        g = groups[it.nodeid.split("::")[0]]
        return (-WEIGHT_S.get(g, sizes[g] / 10), first_seen[g])

    items.sort(key=heavier_first)  # stable: a group's own tests keep their order
