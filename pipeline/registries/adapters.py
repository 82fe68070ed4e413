"""The LoRA adapter registry: which adapters exist, for which base model, where their verified
weights lie, who may use them, and how warm they are. From config plus `control` updates
(`llmpipe adapters register|promote|demote`), like the tenant registry.

Route picks an adapter only when the tenant may use it (otherwise the base model, and says why);
a caller that names an adapter as its `model` gets it picked, and admit and generate refuse it
(`adapter_forbidden`) when the tenant may not use it. Weights load only from allow-listed
directories and only when their checksum matches the registry; anything else is `incompatible`
and never served.
"""

from __future__ import annotations

import hashlib
import shutil
import uuid
from pathlib import Path

from pipeline.config.lora import LoraSettings
from pipeline.contracts.adapter import ANY_TENANT, AdapterSpec


def adapter_digest(directory: Path) -> str:
    """SHA-256 over the directory's files (sorted relative names and contents): one number for
    config + weights, so a swapped or edited file is caught."""
    h = hashlib.sha256()
    for f in sorted(p for p in Path(directory).rglob("*") if p.is_file()):
        h.update(str(f.relative_to(directory)).encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        h.update(b"\0")
    return h.hexdigest()


def incompatibility(spec: AdapterSpec, lora: LoraSettings, base_revision: str | None = None,
                    check_files: bool = True) -> str | None:
    """Why this adapter must never be served here (None: it may)."""
    roots = [r.expanduser().resolve() for r in lora.allowed_roots]
    path = spec.path.expanduser().resolve()
    if not any(path.is_relative_to(r) for r in roots):
        return "path outside the allowed adapter roots"
    if spec.rank > lora.max_lora_rank:
        return f"rank {spec.rank} > max_lora_rank {lora.max_lora_rank}"
    if base_revision and spec.base_revision and spec.base_revision != base_revision:
        return f"trained on base revision {spec.base_revision}, the deployment serves {base_revision}"
    if check_files:
        if spec.path.expanduser().is_symlink() or any(p.is_symlink() for p in path.rglob("*")):
            return "symlinks inside an adapter directory (they could point outside the allowed roots)"
        if not (path / "adapter_config.json").is_file():
            return "no adapter_config.json"
        if adapter_digest(path) != spec.sha256:
            return "checksum mismatch"
    return None


def verified_snapshot(spec: AdapterSpec, lora: LoraSettings, snapshots: Path,
                      base_revision: str | None = None) -> tuple[Path | None, str | None]:
    """(a private copy of the adapter whose digest matches the registry, None) or (None, why not).

    The engine loads the copy, never the registered directory: vLLM may evict an adapter and read it
    again later on its own, and by then the directory could have changed. The copy is named by its
    digest and checked again whenever it is reused."""
    why = incompatibility(spec, lora, base_revision)
    if why is not None:
        return None, why
    dest = Path(snapshots) / spec.sha256
    if (dest / "adapter_config.json").is_file() and adapter_digest(dest) == spec.sha256:
        return dest, None
    tmp = dest.with_name(f"{dest.name}.tmp-{uuid.uuid4().hex[:8]}")
    shutil.copytree(spec.path.expanduser().resolve(), tmp, symlinks=True)  # a link stays a link: caught below
    if any(p.is_symlink() for p in tmp.rglob("*")) or adapter_digest(tmp) != spec.sha256:  # changed since the check
        shutil.rmtree(tmp, ignore_errors=True)
        return None, "checksum mismatch"
    shutil.rmtree(dest, ignore_errors=True)  # a copy that no longer verifies
    try:
        tmp.rename(dest)
    except OSError:  # another worker made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return dest, None


class AdapterRegistry:
    """Adapters by name. Lookups replace whole entries (readers on other threads see old or new)."""

    def __init__(self, specs: list[AdapterSpec] | None = None) -> None:
        self.specs: dict[str, AdapterSpec] = {s.name: s for s in specs or []}

    def apply(self, record: object) -> bool:
        from pipeline.contracts.control import AdapterRegistered, AdapterStateChanged

        if isinstance(record, AdapterRegistered):
            self.specs[record.spec.name] = record.spec
            return True
        if isinstance(record, AdapterStateChanged):
            spec = self.specs.get(record.name)
            if spec is None:
                return False
            self.specs[record.name] = spec.model_copy(update={"state": record.state})
            return True
        return False

    def refusal(self, tenant: str | None, name: str) -> tuple[str, str] | None:
        """(error_class, reason) when `tenant` may not be served adapter `name`; None when it may."""
        spec = self.specs.get(name)
        if spec is None:
            return "adapter_unavailable", f"adapter {name!r} is not registered"
        if spec.state == "incompatible":
            return "adapter_unavailable", f"adapter {name!r} is incompatible with this deployment"
        if ANY_TENANT not in spec.tenants and (tenant or "") not in spec.tenants:
            return "adapter_forbidden", f"tenant may not use adapter {name!r}"
        return None


def refuse_adapter(doc, registry: AdapterRegistry) -> tuple[str, str] | None:
    """admit's and generate's check of the adapter route picked: (error_class, reason) to refuse it.

    Each stage follows registrations on the control topic at its own pace. A caller that names an
    adapter this stage knows, which route did not pick (route had not applied the registration
    yet), is refused as unavailable rather than answered by the base model under the adapter's name."""
    if doc.route is None:
        return None
    adapter = doc.route.adapter
    if adapter is None:
        asked = doc.body.model
        if asked and asked in registry.specs:
            return registry.refusal(doc.tenant_id, asked) or (
                "adapter_unavailable", f"adapter {asked!r} is not known to route yet: retry shortly")
        return None
    return registry.refusal(doc.tenant_id, adapter)
