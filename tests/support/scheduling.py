"""How `make test` spreads the suite over two pytest-xdist workers (`-n 2 --dist loadgroup`).

On this 2-core machine most of the suite waits: on a stack to boot, a sink to flush, a model to
answer one request at a time on one thread. Two workers overlap those waits. A work unit is a
module (its module-scoped stack boots once, on one worker), or a named group of modules that share
a session stack (GROUPS: both on one worker, so the stack boots once). Units start longest first
(HEAVY_FIRST, measured), so that no long one starts last and runs alone."""

from __future__ import annotations

import pytest

# modules that share a stack: one unit, on one worker
GROUPS = {
    "tests/test_http_frontdoor.py": "product-stack",
    "tests/test_product_path.py": "product-stack",
}
# the longest units, longest first (seconds measured by the serial suite; the rest follow in file order)
HEAVY_FIRST = [
    "tests/test_actor_serving.py",
    "product-stack",
    "tests/security",
    "tests/test_faults.py",
    "tests/test_demo.py",
    "tests/test_profile.py",
    "tests/test_mask_stack.py",
    "tests/test_cli_stack.py",
    "tests/test_route_replay.py",
    "tests/test_actor_lifecycle.py",
]


def unit_of(path: str) -> str:
    """The work unit of a test file (a path relative to the repository)."""
    if path in GROUPS:
        return GROUPS[path]
    if path.startswith("tests/security/"):
        return "tests/security"  # one package-scoped review stack
    return path


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups into node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def unit(item: pytest.Item) -> str:
        return unit_of(item.nodeid.split("::", 1)[0])

    rank = {u: i for i, u in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda it: rank.get(unit(it), len(rank)))  # stable: file order within and after
    for item in items:
        item.add_marker(pytest.mark.xdist_group(unit(item)))
