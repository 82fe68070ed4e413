"""Session fixtures shared across test modules, loaded by tests/conftest.py as a plugin (a fixture
imported into two modules would be two fixtures, and boot twice)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.product import ProductStack, product_stack_in


@pytest.fixture(scope="session")
def product_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProductStack]:
    """The shared product stack (tests/support/product.py): booted once, by the first test that asks."""
    with product_stack_in(tmp_path_factory.mktemp("product")) as stack:
        yield stack
