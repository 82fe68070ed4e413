"""The LoRA adapter registry as pure policy: verification before anything loads, tenant
authorisation, route's choice, and admit's and generate's refusal of an adapter a tenant may not use."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.config.lora import LoraSettings
from pipeline.config.settings import Settings, StageSpec
from pipeline.contracts import RequestDoc
from pipeline.contracts.adapter import AdapterSpec
from pipeline.contracts.control import (
    AdapterRegistered,
    AdapterStateChanged,
    ControlRecord,
)
from pipeline.contracts.request import RouteSection
from pipeline.registries.adapters import (
    AdapterRegistry,
    adapter_digest,
    incompatibility,
    refuse_adapter,
    verified_snapshot,
)
from pipeline.runtime.codec import decode, encode
from pipeline.runtime.stage import StageContext
from pipeline.stages.route.stage import pick_adapter


@pytest.fixture
def adapter_dir(tmp_path):
    d = tmp_path / "roots" / "support-lora"
    d.mkdir(parents=True)
    (d / "adapter_config.json").write_text('{"r": 8, "target_modules": ["q_proj"]}')
    (d / "adapter_model.safetensors").write_bytes(b"\x00" * 64)
    return d


def spec(d, **kw) -> AdapterSpec:
    base = dict(name="support-lora", revision="r1", path=d, sha256=adapter_digest(d), rank=8, tenants=["acme"])
    return AdapterSpec(**{**base, **kw})


def test_verification_refuses_what_must_never_load(adapter_dir, tmp_path):
    lora = LoraSettings(allowed_roots=[tmp_path / "roots"], max_lora_rank=16)
    assert incompatibility(spec(adapter_dir), lora) is None
    assert incompatibility(spec(adapter_dir), LoraSettings(allowed_roots=[tmp_path / "elsewhere"])) == \
        "path outside the allowed adapter roots"
    assert "max_lora_rank" in incompatibility(spec(adapter_dir, rank=32), lora)
    assert "base revision" in incompatibility(spec(adapter_dir, base_revision="b1"), lora, base_revision="b2")
    good = spec(adapter_dir)
    (adapter_dir / "adapter_model.safetensors").write_bytes(b"\x01" * 64)  # swapped weights
    assert incompatibility(good, lora) == "checksum mismatch"
    assert adapter_digest(adapter_dir) != good.sha256


def test_a_symlink_inside_an_adapter_is_refused(adapter_dir, tmp_path):
    """A link could make the engine read a file outside the allowed roots (the digest follows it)."""
    lora = LoraSettings(allowed_roots=[tmp_path / "roots"], max_lora_rank=16)
    secret = tmp_path / "outside.bin"
    secret.write_bytes(b"not an adapter")
    (adapter_dir / "extra.bin").symlink_to(secret)
    linked = spec(adapter_dir)
    assert "symlinks" in incompatibility(linked, lora)
    path, why = verified_snapshot(linked, lora, tmp_path / "snapshots")
    assert path is None and "symlinks" in why


def test_the_engine_loads_a_verified_private_copy(adapter_dir, tmp_path):
    lora = LoraSettings(allowed_roots=[tmp_path / "roots"])
    s = spec(adapter_dir)
    copy, why = verified_snapshot(s, lora, tmp_path / "verified")
    assert why is None and copy == tmp_path / "verified" / s.sha256 and adapter_digest(copy) == s.sha256
    # the registered directory changes later: the copy the engine reads stays what was verified,
    # and a new load is refused
    (adapter_dir / "adapter_model.safetensors").write_bytes(b"\x01" * 64)
    assert adapter_digest(copy) == s.sha256
    assert verified_snapshot(s, lora, tmp_path / "verified") == (None, "checksum mismatch")
    # a damaged copy is never reused: it is made again from a directory that verifies
    (adapter_dir / "adapter_model.safetensors").write_bytes(b"\x00" * 64)
    (copy / "adapter_model.safetensors").write_bytes(b"junk")
    again, why = verified_snapshot(s, lora, tmp_path / "verified")
    assert why is None and adapter_digest(again) == s.sha256
    assert verified_snapshot(s, LoraSettings(allowed_roots=[tmp_path / "x"]), tmp_path / "verified")[0] is None


def test_registry_authorises_per_tenant_and_follows_control(adapter_dir):
    reg = AdapterRegistry([spec(adapter_dir)])
    assert reg.refusal("acme", "support-lora") is None
    assert reg.refusal("globex", "support-lora")[0] == "adapter_forbidden"
    assert reg.refusal("acme", "nope")[0] == "adapter_unavailable"
    # records survive the wire (the control topic) and change the registry
    everyone = ControlRecord.model_validate_json(encode(AdapterRegistered(spec=spec(adapter_dir, name="faq-lora",
                                                                                     tenants=["*"])))).root
    assert reg.apply(everyone) and reg.refusal("anyone", "faq-lora") is None
    assert reg.apply(decode(encode(AdapterStateChanged(name="faq-lora", state="incompatible")), ControlRecord).root)
    assert reg.refusal("anyone", "faq-lora")[0] == "adapter_unavailable"
    assert not reg.apply(AdapterStateChanged(name="unknown", state="hot"))


def doc(model: str | None = None, tenant: str = "acme", adapter: str | None = None) -> RequestDoc:
    d = RequestDoc(request_id="r1", tenant_id=tenant,
                   body={"messages": [{"role": "user", "content": "I want a refund"}], "model": model})
    if adapter is not None:
        d = d.model_copy(update={"route": RouteSection(decision="support", reason="t", model="small", adapter=adapter,
                                                       policy_version="v")})
    return d


def test_route_picks_an_adapter_only_for_tenants_that_may_use_it(adapter_dir):
    reg = AdapterRegistry([spec(adapter_dir)])
    assert pick_adapter(doc(), "support-lora", reg) == ("support-lora", "adapter support-lora")
    name, why = pick_adapter(doc(tenant="globex"), "support-lora", reg)
    assert name is None and why.startswith("base model: tenant may not use")
    assert pick_adapter(doc(), "unregistered-lora", reg)[0] is None
    # a caller naming an adapter as its model gets it picked; admit decides whether it runs
    assert pick_adapter(doc(model="support-lora", tenant="globex"), None, reg)[0] == "support-lora"
    assert pick_adapter(doc(model="gpt-4o-mini"), None, reg) == (None, "")


@pytest.mark.parametrize("stage_name", ["admit", "generate"])
def test_admit_and_generate_refuse_an_adapter_the_tenant_may_not_use(adapter_dir, tmp_path, stage_name):
    from pipeline.stages.admit.stage import AdmitStage
    from pipeline.stages.generate.stage import GenerateStage

    s = Settings(data_dir=tmp_path, stages=[StageSpec(name=stage_name)], adapters=[spec(adapter_dir)])
    cls = {"admit": AdmitStage, "generate": GenerateStage}[stage_name]
    stage = cls(StageContext(spec=s.stage(stage_name), settings=s, runtime=s.runtime))
    run = stage.process if stage_name == "admit" else stage._cancellable
    out = asyncio.run(run(doc(tenant="globex", adapter="support-lora")))
    assert out.response is not None and out.response.error_class == "adapter_forbidden"
    assert out.evidence[0].decision == "refused" and out.evidence[0].labels == {"adapter": "support-lora"}
    out = asyncio.run(run(doc(tenant="acme", adapter="no-such-lora")))
    assert out.response.error_class == "adapter_unavailable"


def test_a_caller_asking_for_an_adapter_route_had_not_learnt_yet_is_refused_not_served_by_the_base(adapter_dir):
    # each stage follows registrations at its own pace: route, not yet knowing `support-lora`, routed
    # the request with no adapter; admit (and generate) already know it and must not let the base
    # model answer under the adapter's name
    reg = AdapterRegistry([spec(adapter_dir)])
    lagging = doc(model="support-lora").model_copy(update={"route": RouteSection(
        decision="default", reason="t", model="small", adapter=None, policy_version="v")})
    refused = refuse_adapter(lagging, reg)
    assert refused is not None and refused[0] == "adapter_unavailable" and "not known to route yet" in refused[1]
    other = lagging.model_copy(update={"tenant_id": "globex"})
    assert refuse_adapter(other, reg)[0] == "adapter_forbidden"  # the tenant's own refusal comes first
    plain = doc(model="gpt-4o-mini").model_copy(update={"route": lagging.route})
    assert refuse_adapter(plain, reg) is None  # a model name that is no adapter is only a hint
