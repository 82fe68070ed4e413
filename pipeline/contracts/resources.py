"""Locate the project's data files (topic registry, JSON Schemas, ClickHouse DDL).

In a wheel they are bundled under pipeline/_bundled; in a source checkout they live at the
repository root (topics/, schemas/).
"""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parents[1]  # pipeline/


def _root(name: str) -> Path:
    for candidate in (_PKG / "_bundled" / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"llmpipe data directory {name!r} not found next to {_PKG}")


def topics_file() -> Path:
    return _root("topics") / "topics.yaml"


def schemas_dir() -> Path:
    return _root("schemas")


def clickhouse_migrations_dir() -> Path:
    return schemas_dir() / "clickhouse"
