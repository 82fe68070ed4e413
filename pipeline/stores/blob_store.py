"""The claim-check store: large payloads (image bytes, decoded pixels, vision features) live here
and events carry references. Content-addressed and tenant-scoped: a reference names its tenant,
and a read for another tenant is refused, so one tenant can never load another's blob even with
its hash. Local directory by default (an S3-compatible store in production has the same shape).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tempfile
from pathlib import Path

import numpy as np

SCHEME = "blob://"
_REF = re.compile(r"^blob://([A-Za-z0-9][A-Za-z0-9._-]{0,127})/([0-9a-f]{64})\.([a-z0-9]{1,8})$")


class BlobError(Exception):
    def __init__(self, error_class: str, reason: str) -> None:
        super().__init__(reason)
        self.error_class = error_class
        self.reason = reason


def tenant_key(tenant: str | None) -> str:
    """The blob namespace of a tenant: its name when it is a safe path segment, else a digest of it."""
    if tenant and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", tenant):
        return tenant
    return "t-" + hashlib.sha256((tenant or "").encode()).hexdigest()[:24]


def parse_ref(ref: str) -> tuple[str, str, str]:
    m = _REF.match(ref)
    if m is None:
        raise BlobError("blob_not_found", "not a blob reference (blob://<tenant>/<sha256>.<ext>)")
    return m.group(1), m.group(2), m.group(3)


class LocalBlobStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _path(self, tenant: str, digest: str, ext: str) -> Path:
        return self.root / tenant / digest[:2] / f"{digest}.{ext}"

    def put(self, tenant: str, data: bytes, ext: str) -> str:
        """Store once per (tenant, content); returns the reference. Atomic: a reader never sees half."""
        digest = hashlib.sha256(data).hexdigest()
        ref = f"{SCHEME}{tenant}/{digest}.{ext}"
        parse_ref(ref)  # validates the tenant name and extension
        path = self._path(tenant, digest, ext)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        return ref

    def put_array(self, tenant: str, array: np.ndarray) -> str:
        """An array as a .npy blob (no pickle: readers load it with allow_pickle=False)."""
        buf = io.BytesIO()
        np.save(buf, array, allow_pickle=False)
        return self.put(tenant, buf.getvalue(), "npy")

    def get_array(self, ref: str, tenant: str) -> np.ndarray:
        return np.load(io.BytesIO(self.get(ref, tenant)), allow_pickle=False)

    def get(self, ref: str, tenant: str) -> bytes:
        owner, digest, ext = parse_ref(ref)
        if owner != tenant:
            raise BlobError("blob_forbidden", "the blob belongs to another tenant")
        path = self._path(owner, digest, ext)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise BlobError("blob_not_found", "no such blob") from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise BlobError("blob_corrupt", "the blob's content does not match its hash")
        return data

    def exists(self, ref: str) -> bool:
        owner, digest, ext = parse_ref(ref)
        return self._path(owner, digest, ext).exists()
