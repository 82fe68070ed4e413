"""Session fixtures shared across test modules, loaded by tests/conftest.py as a plugin (a fixture
imported into two modules would be two fixtures, and boot twice)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from tests.support.product import ProductStack, product_stack_in

# The product stack goes down after the last test that uses it, not at the end of the session:
# left up, its idle workers hold ~8 GiB and poll the broker through the rest of the run.
_product = contextlib.ExitStack()
_last_user: list[str] = []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    users = [it.nodeid for it in items if "product_stack" in getattr(it, "fixturenames", ())]
    _last_user[:] = users[-1:]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if _last_user and item.nodeid == _last_user[0]:
        _product.close()  # `llmpipe down`; the fixture's own exit is then a no-op


@pytest.fixture(scope="session")
def product_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProductStack]:
    """The shared product stack (tests/support/product.py): booted once, by the first test that asks."""
    with _product:
        yield _product.enter_context(product_stack_in(tmp_path_factory.mktemp("product")))
