"""Session fixtures shared across test modules, loaded by tests/conftest.py as a plugin (a fixture
imported into two modules would be two fixtures, and boot twice)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.product import ProductStack, product_stack_in

# The product stack goes down after the last test that uses it, not at the end of the session:
# left up, its idle workers hold ~8 GiB and poll the broker through the rest of the run.
_product = contextlib.ExitStack()
_last_user: list[str] = []
MODEL_ENV = "LLMPIPE_ENGINE__MODEL_DIR"


@pytest.hookimpl(trylast=True)  # after tests/conftest.py has marked the integration tests
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    users = [it.nodeid for it in items if "product_stack" in getattr(it, "fixturenames", ())]
    _last_user[:] = users[-1:]
    for it in items:  # first, so that session stacks boot with it set
        if it.get_closest_marker("integration") is not None and hasattr(it, "fixturenames"):
            it.fixturenames.insert(0, "shared_model")


@pytest.fixture(scope="session")
def shared_model(prepared_model: Path) -> Iterator[Path]:
    """Every stack a test starts serves the session's prepared SmolLM2 (engine.model_dir, through the
    environment its processes inherit) instead of preparing it again from the GGUF in each fresh
    data dir: ~20 s of CPU each, for 20-odd stacks. A test's own engine.model_dir still wins; preparing
    on a fresh data dir (also by two processes at once) is tested in tests/test_vllm_engine.py."""
    old = os.environ.get(MODEL_ENV)
    os.environ[MODEL_ENV] = str(prepared_model)
    yield prepared_model
    if old is None:
        os.environ.pop(MODEL_ENV, None)
    else:
        os.environ[MODEL_ENV] = old


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if _last_user and item.nodeid == _last_user[0]:
        _product.close()  # `llmpipe down`; the fixture's own exit is then a no-op


@pytest.fixture(scope="session")
def product_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProductStack]:
    """The shared product stack (tests/support/product.py): booted once, by the first test that asks."""
    with _product:
        yield _product.enter_context(product_stack_in(tmp_path_factory.mktemp("product")))
