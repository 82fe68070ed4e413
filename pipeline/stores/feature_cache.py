"""Vision features by (image content, processor revision, encoder revision, tenant).

The tenant is part of the key and of the path, so one tenant's features are never served to
another, even for the same image. Files under DATA_DIR/features/<tenant>/ (shared by the vision
workers of one host) with a small in-process LRU in front.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections import OrderedDict
from pathlib import Path

import orjson

from pipeline.stores.blob_store import tenant_key


def feature_key(image_sha256: str, processor_revision: str, encoder_revision: str) -> str:
    return hashlib.sha256(f"{image_sha256}|{processor_revision}|{encoder_revision}".encode()).hexdigest()


class FeatureCache:
    def __init__(self, root: Path, memory_entries: int = 4096) -> None:
        self.root = Path(root)
        self.memory: OrderedDict[tuple[str, str], dict] = OrderedDict()
        self.memory_entries = memory_entries

    def _path(self, tenant: str, key: str) -> Path:
        return self.root / tenant_key(tenant) / key[:2] / f"{key}.json"

    def get(self, tenant: str, key: str) -> dict | None:
        mk = (tenant_key(tenant), key)
        hit = self.memory.get(mk)
        if hit is not None:
            self.memory.move_to_end(mk)
            return hit
        try:
            value = orjson.loads(self._path(tenant, key).read_bytes())
        except FileNotFoundError:
            return None
        self._remember(mk, value)
        return value

    def put(self, tenant: str, key: str, value: dict) -> None:
        path = self._path(tenant, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(orjson.dumps(value))
        os.replace(tmp, path)
        self._remember((tenant_key(tenant), key), value)

    def _remember(self, mk: tuple[str, str], value: dict) -> None:
        self.memory[mk] = value
        self.memory.move_to_end(mk)
        while len(self.memory) > self.memory_entries:
            self.memory.popitem(last=False)
