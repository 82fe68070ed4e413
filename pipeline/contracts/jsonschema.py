"""JSON Schemas of the wire models, checked in under schemas/ (a test fails when they drift).

Regenerate with `python -m pipeline.contracts.jsonschema` (or `make schemas`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pipeline.contracts import WIRE_MODELS
from pipeline.contracts.resources import schemas_dir


def render(name: str) -> str:
    schema = WIRE_MODELS[name].model_json_schema(by_alias=True, mode="serialization")
    schema["$id"] = f"llmpipe/{name}.json"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write_all(directory: Path | None = None) -> list[Path]:
    directory = directory or schemas_dir()
    paths = []
    for name in WIRE_MODELS:
        path = directory / f"{name}.json"
        path.write_text(render(name))
        paths.append(path)
    return paths


if __name__ == "__main__":
    for p in write_all(Path(sys.argv[1]) if len(sys.argv) > 1 else None):
        print(p)
