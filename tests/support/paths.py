"""Where the repository and its test fixtures are."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
DATA = ROOT / "tests" / "data"
