"""Process settings: defaults < YAML file (--config / LLMPIPE_CONFIG) < environment (LLMPIPE_*)."""

from __future__ import annotations

import os
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, PrivateAttr, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from pipeline.config.feedback import FeedbackSettings
from pipeline.config.lora import LoraSettings
from pipeline.config.tenants import RateLimits, TenantLimits, TenantSpec, default_tenant_limits
from pipeline.contracts.adapter import AdapterSpec

CONFIG_ENV = "LLMPIPE_CONFIG"
DEFAULT_CONFIG_FILE = "llmpipe.yaml"
# What the stages add to a request document at most: sections, timings, an embedding, and the token
# ids and logprobs of a long answer (2,048 tokens x ~30 bytes) - with a wide margin.
DOC_GROWTH_BYTES = 1 << 20
MAX_IMAGE_PIXELS = 40_000_000  # media's default pixel budget, also OpenCV's own cap in worker processes


IDLE_DOZE_MAX_MS = 2000  # runtime/wakeup/bellpoll.py, step 3a


class ConsumerSettings(BaseModel):
    """aiokafka consumer defaults measured on the embedded broker (docs/decisions/0001-embedded-broker-tansu.md)."""

    # aiokafka's 500 ms default costs half a second per hop; 5-10 ms gives p50 ~3 ms.
    fetch_max_wait_ms: int = 5
    # A killed member's partitions move after session_timeout (+ half of it to rebalance).
    session_timeout_ms: int = 6000
    heartbeat_interval_ms: int = 1500
    max_poll_interval_ms: int = 300_000
    rebalance_timeout_ms: int = 6000
    max_partition_fetch_bytes: int = 1 << 20
    fetch_max_bytes: int = 16 << 20
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    # getmany() once hung during a broker outage: every call is bounded by this.
    poll_guard_s: float = 10.0
    # Idle consumers poll slower (FetchPacer): the broker's idle cost falls ~10x; the first record
    # after an idle spell waits up to idle_fetch_max_wait_ms. Equal to fetch_max_wait_ms: off.
    idle_fetch_max_wait_ms: int = Field(50, ge=1)
    idle_after_ms: int = Field(1000, ge=0)
    # With a `doorbell_dir` (runtime/wakeup/doorbell.py) a consumer fetches without waiting, and one that
    # found nothing waits for a producer to ring it, at most doze_max_ms (runtime/wakeup/bellpoll.py).
    doorbell: bool = Field(True, description="use the doorbell when the process has a doorbell_dir")
    doze_max_ms: int = Field(200, ge=1)
    # ... and each doze no ring ended doubles the next, up to this (runtime/wakeup/bellpoll.py, step 3a)
    idle_doze_max_ms: int = Field(IDLE_DOZE_MAX_MS, ge=1)
    # Without a doorbell: fetch at most once per this many ms while nothing comes (the warehouse
    # sink, whose flush interval paces it anyway); None: poll with the fetch waits above.
    fetch_every_ms: int | None = Field(None, ge=1)


class KafkaSecurity(BaseModel):
    """How every Kafka client of a process authenticates to the brokers (aiokafka's options). The
    embedded broker speaks PLAINTEXT only; a cluster should use SASL_SSL (or SSL with client certs)
    with ACLs that let only the front door write `requests` and only stage principals write `stage.*`
    and `control` (docs/design.md, "Who may write which topic")."""

    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = Field(None, description="from LLMPIPE_KAFKA__SASL_PASSWORD or a mounted Secret")
    ssl_cafile: Path | None = Field(None, description="CA bundle that signed the brokers' certificates")
    ssl_certfile: Path | None = Field(None, description="client certificate (mutual TLS)")
    ssl_keyfile: Path | None = None

    @model_validator(mode="after")
    def _complete(self) -> KafkaSecurity:
        if self.security_protocol.startswith("SASL") and not (self.sasl_mechanism and self.sasl_username
                                                              and self.sasl_password):
            raise ValueError("kafka: SASL needs sasl_mechanism, sasl_username and sasl_password")
        return self

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for any aiokafka client (producer, consumer, admin)."""
        if self.security_protocol == "PLAINTEXT":
            return {}
        kw: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.security_protocol.endswith("SSL"):
            import ssl

            ctx = ssl.create_default_context(cafile=str(self.ssl_cafile) if self.ssl_cafile else None)
            if self.ssl_certfile:
                ctx.load_cert_chain(str(self.ssl_certfile), str(self.ssl_keyfile) if self.ssl_keyfile else None)
            kw["ssl_context"] = ctx
        if self.security_protocol.startswith("SASL"):
            assert self.sasl_password is not None
            kw |= {"sasl_mechanism": self.sasl_mechanism, "sasl_plain_username": self.sasl_username,
                   "sasl_plain_password": self.sasl_password.get_secret_value()}
        return kw


def kafka_kwargs(security: KafkaSecurity | None) -> dict[str, Any]:
    return security.client_kwargs() if security is not None else {}


# A produce request the broker does not answer within this fails, and its caller's loop sends it again.
# It bounds how long a restarted embedded broker waits for the old broker's records to settle
# (runtime/broker/gate.py), so every producer of the stack stays within it.
PRODUCE_TIMEOUT_MAX_MS = 5_000


class ProducerSettings(BaseModel):
    # acks=all; the embedded broker refuses InitProducerId, so no idempotent producer.
    acks: Literal["all", 1] = "all"
    enable_idempotence: bool = False
    linger_ms: int = 1
    max_batch_size: int = 256 << 10
    max_request_size: int = 8 << 20
    request_timeout_ms: int = Field(PRODUCE_TIMEOUT_MAX_MS, ge=100, le=PRODUCE_TIMEOUT_MAX_MS)


class RuntimeSettings(BaseModel):
    """Stage-worker knobs; a Stage may override concurrency and batching for itself."""

    queue_bound: int = Field(200, ge=1, description="max records held in the in-process queue")
    high_watermark: float = Field(0.8, gt=0, le=1, description="pause partitions at this queue fill")
    low_watermark: float = Field(0.3, ge=0, lt=1, description="resume partitions at this queue fill")
    concurrency: int = Field(16, ge=1)
    max_attempts: int = Field(3, ge=1, description="processing attempts before the DLQ")
    retry_backoff_ms: int = 50
    commit_interval_ms: int = 200
    drain_timeout_s: float = 30.0

    @model_validator(mode="after")
    def _watermarks(self) -> RuntimeSettings:
        if self.low_watermark >= self.high_watermark:
            raise ValueError("runtime.low_watermark must be below runtime.high_watermark")
        return self


class SinkSettings(BaseModel):
    batch_size: int = 5000
    # also how often an idle sink fetches (consumer.fetch_every_ms): it writes no faster anyway
    flush_interval_ms: int = Field(500, ge=1)


class EngineSettings(BaseModel):
    """The in-process vLLM engine of the embedded stack."""

    model_dir: Path | None = Field(None, description="default: DATA_DIR/models/smollm2-135m-instruct, prepared on start")
    # auto: bfloat16 where the hardware has it natively, else float32 (engines/hardware.py; measured 2-3x
    # faster in float32 on an AVX2-only CPU, where bf16 is emulated)
    dtype: Literal["auto", "bfloat16", "float32"] = "auto"
    max_model_len: int = 2048
    max_num_seqs: int = 16


class Deployment(BaseModel):
    """A place generate can send a request: an engine serving a model, with what it can do and costs."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    engine: Literal["vllm", "openai"] = "vllm"
    model: str = "smollm2-135m-instruct"
    revision: str = Field("", description="model revision; vllm: derived from the prepared model when empty")
    base_url: str | None = Field(None, description="openai engine: the server's /v1 base URL")
    model_dir: Path | None = Field(None, description="vllm engine: default = the prepared SmolLM2 in DATA_DIR")
    max_context: int = Field(2048, ge=16)
    images: bool = False
    json_schema: bool = False
    tools: bool | None = Field(None, description="serves tool calls; default: the vllm engine when it has "
                                                 "json_schema (tools through a grammar), an openai server never")
    lora: bool = Field(False, description="serves the registry's LoRA adapters of its model (vllm engine, "
                                          "with `lora.enabled`)")
    region: str = "local"
    cost_per_1k_input: float = Field(0.0, ge=0)
    cost_per_1k_output: float = Field(0.0, ge=0)
    api_key_env: str | None = Field(None, description="openai engine: environment variable holding its API key")
    concurrency: int = Field(16, ge=1, description="max requests in flight to this deployment per worker")
    limits: RateLimits = Field(default_factory=RateLimits,
                               description="global limits over every tenant, enforced by admit: each admit "
                                           "partition owns an equal share, so the sum never exceeds them")

    @property
    def serves_tools(self) -> bool:
        return self.tools if self.tools is not None else self.engine == "vllm" and self.json_schema

    @model_validator(mode="after")
    def _engine_fields(self) -> Deployment:
        if self.engine == "openai" and not self.base_url:
            raise ValueError(f"deployment {self.name}: the openai engine needs base_url")
        if self.lora and self.engine != "vllm":
            raise ValueError(f"deployment {self.name}: only the vllm engine serves LoRA adapters here")
        return self


def default_deployments() -> list[Deployment]:
    return [Deployment(name="local-vllm", engine="vllm", json_schema=True)]


class AuthSettings(BaseModel):
    """How the door and mask treat requests without an API key. Keys present are always verified."""

    required: bool = Field(True, description="true (the default): a request without an API key is rejected "
                                             "unauthenticated; false: trusted producers may publish tenant_id "
                                             "directly, and a request naming none runs as tenant `anonymous`")
    dev_tenant: str | None = Field("dev", description="`llmpipe up` on a data dir without keys creates this tenant "
                                                      "and prints its key once (DATA_DIR/secrets/dev-api-key, "
                                                      "0600); None: no development tenant")


class EmbeddedBrokerSettings(BaseModel):
    """The embedded broker's planned roll (runtime/broker/roll.py): its memory storage never frees a
    record, so the supervisor restarts it, drained and with its compacted topics carried over."""

    roll_rss_mib: int = Field(512, ge=0, description="roll once the broker's RSS reaches this; 0 = never")
    roll_check_s: float = Field(10.0, gt=0, description="how often the RSS is read")
    roll_min_interval_s: float = Field(300.0, ge=0, description="at least this long between two rolls")
    roll_drain_s: float = Field(30.0, gt=0, description="longest wait for the stack to go quiet before a roll")
    roll_retry_s: float = Field(60.0, gt=0, description="after a roll that could not drain, try again after this")


class HttpSettings(BaseModel):
    """The OpenAI-compatible front door (`llmpipe serve`; `llmpipe up` runs one in the supervisor)."""

    host: str = Field("127.0.0.1", description="0.0.0.0 in containers")
    port: int = Field(0, ge=0, description="0 = any free port (written to stack.json as http_url)")
    request_timeout_s: float = Field(120.0, gt=0, description="deadline of a request that names none")
    max_timeout_s: float = Field(600.0, gt=0, description="the longest deadline a caller may ask for")
    max_body_bytes: int = Field(4 << 20, ge=1024, description="larger bodies are answered 413 unread; must stay "
                                                              "well below producer.max_request_size, since every "
                                                              "stage makes the request document bigger")
    reply_partition: int | None = Field(None, ge=0, description="this front door's reply partition (None: random)")
    publish_timeout_s: float = Field(5.0, gt=0, description="a request the broker has not acknowledged by then is "
                                                            "answered 503 broker_unavailable (and later ones at "
                                                            "once, until the broker answers again)")
    tokenizer: bool = Field(True, description="load the served model's tokenizer to spell logprob tokens "
                                              "(false: tokens are shown as ids)")
    max_queue_s: float | None = Field(None, gt=0, description="refuse a request at once (503 overloaded, "
                                                                "Retry-After) when its estimated time to an answer "
                                                                "exceeds this; unset: only beyond its own deadline "
                                                                "(pipeline/ingress/shed.py)")


class SecretSettings(BaseModel):
    """Secrets come from the environment or a secret-mounted file, never from logs or topics."""

    # key id -> base64 of 32 random bytes; unset: a local key is generated in DATA_DIR/secrets
    mask_keys: dict[str, SecretStr] = Field(default_factory=dict)
    mask_active_key: str | None = None
    # bearer token of the warehouse's admin endpoint (/sql, /profile_runs); unset: generated into
    # DATA_DIR/secrets/admin.token on first use (LLMPIPE_SECRETS__ADMIN_TOKEN sets it)
    admin_token: SecretStr | None = None


class StageSpec(BaseModel):
    """One stage group of the topology: a name and the class that implements it."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    # "package.module:Class"; product stages resolve by name from pipeline.stages.
    cls: str | None = Field(None, alias="class")
    # Free-form policy settings handed to the stage (thresholds, versions, ...).
    policy: dict[str, Any] = Field(default_factory=dict)
    runtime: dict[str, Any] = Field(default_factory=dict, description="RuntimeSettings overrides")
    consumer: dict[str, Any] = Field(default_factory=dict, description="ConsumerSettings overrides (e.g. fetch_max_wait_ms)")
    chain: bool | None = Field(None, description="run in the previous stage's workers, handed over in memory instead "
                                                 "of through its input topic (same partition key required). Unset: "
                                                 "chained unless topics/topics.yaml marks a boundary at its input "
                                                 "(false splits it off, to scale it alone); see docs/design.md, "
                                                 "\"Stage chains\"")

    model_config = {"populate_by_name": True}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="LLMPIPE_", env_nested_delimiter="__", extra="forbid", populate_by_name=True
    )

    _config_file: str | None = PrivateAttr(None)  # the YAML file these came from (for child processes)

    data_dir: Path = Path(".llmpipe")
    bootstrap: str | None = None
    topic_prefix: str = "llmpipe."
    # chdb:///abs/dir (embedded, default DATA_DIR/warehouse) or http(s)://host:port for a server.
    warehouse_dsn: str | None = None
    worker_id: str | None = None
    metrics_port: int | None = Field(None, description="Prometheus port; 0 = any free port")
    metrics_host: str = Field("127.0.0.1", description="0.0.0.0 in containers, so Prometheus can scrape")
    admin_port: int = 0
    warehouse_user: str | None = Field(None, description="ClickHouse server user (not in the DSN: it is logged)")
    warehouse_password: SecretStr | None = Field(None, description="ClickHouse server password, from the environment "
                                                                   "or a mounted Secret")
    # semantic cache index: edge:/dir (embedded, default DATA_DIR/cache-index/edge), qdrant:http://host:6333
    vector_index: str | None = None
    qdrant_api_key: SecretStr | None = Field(None, description="the Qdrant server's API key")
    broker_port: int = 0
    embedded_broker: EmbeddedBrokerSettings = EmbeddedBrokerSettings()
    doorbell_dir: Path | None = Field(None, description="wake-up hints between the processes of one host "
                                                        "(runtime/wakeup/doorbell.py); for a broker that never wakes a "
                                                        "waiting fetch, like the embedded one. `llmpipe up` on "
                                                        "the embedded broker chooses one unless this is set or "
                                                        "consumer.doorbell is off")
    stages: list[StageSpec] = Field(default_factory=list)
    consumer: ConsumerSettings = ConsumerSettings()
    kafka: KafkaSecurity = KafkaSecurity()
    producer: ProducerSettings = ProducerSettings()
    runtime: RuntimeSettings = RuntimeSettings()
    sink: SinkSettings = SinkSettings()
    secrets: SecretSettings = SecretSettings()
    engine: EngineSettings = EngineSettings()
    deployments: list[Deployment] = Field(default_factory=default_deployments)
    tenants: list[TenantSpec] = Field(default_factory=list, description="tenants and hashed keys; control adds more")
    tenant_defaults: TenantLimits = Field(default_factory=default_tenant_limits,
                                          description="limits of a tenant nobody configured (unknown, anonymous)")
    auth: AuthSettings = AuthSettings()
    adapters: list[AdapterSpec] = Field(default_factory=list, description="LoRA adapters; control adds more")
    lora: LoraSettings = LoraSettings()
    http: HttpSettings = HttpSettings()
    feedback: FeedbackSettings = FeedbackSettings()
    log_level: str = "INFO"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        path = config_path()
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if path:
            if not Path(path).is_file():
                raise FileNotFoundError(f"config file not found: {path}")
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=path))
        return tuple(sources)

    def resolved_data_dir(self) -> Path:
        return self.data_dir.expanduser().resolve()

    def resolved_warehouse_dsn(self) -> str:
        return self.warehouse_dsn or f"chdb://{self.resolved_data_dir() / 'warehouse'}"

    @model_validator(mode="after")
    def _body_fits_topics(self) -> Settings:
        room = self.producer.max_request_size - self.http.max_body_bytes
        if room < DOC_GROWTH_BYTES:
            raise ValueError(f"http.max_body_bytes ({self.http.max_body_bytes}) must be at least {DOC_GROWTH_BYTES} "
                             f"bytes below producer.max_request_size ({self.producer.max_request_size}): the "
                             f"stages add their sections to the document on its way")
        return self

    @model_validator(mode="after")
    def _unique_deployments(self) -> Settings:
        names = [d.name for d in self.deployments]
        if len(names) != len(set(names)):
            raise ValueError(f"deployment names must be unique: {names}")
        return self

    def stage(self, name: str) -> StageSpec:
        for spec in self.stages:
            if spec.name == name:
                return spec
        known = ", ".join(s.name for s in self.stages) or "none"
        raise KeyError(f"stage {name!r} is not in the topology (configured: {known})")

    def runtime_for(self, spec: StageSpec) -> RuntimeSettings:
        if not spec.runtime:
            return self.runtime
        return RuntimeSettings.model_validate({**self.runtime.model_dump(), **spec.runtime})

    def consumer_for(self, spec: StageSpec) -> ConsumerSettings:
        if not spec.consumer:
            return self.consumer
        return ConsumerSettings.model_validate({**self.consumer.model_dump(), **spec.consumer})


# --config for the Settings being built now: a context variable, not os.environ, so one in-process
# call never changes the config of later ones (or of every child process started after it)
_explicit_config: ContextVar[str | None] = ContextVar("llmpipe_config", default=None)


def config_path() -> str | None:
    """The YAML file settings come from: --config, else LLMPIPE_CONFIG, else ./llmpipe.yaml if present."""
    return (_explicit_config.get() or os.environ.get(CONFIG_ENV)
            or (DEFAULT_CONFIG_FILE if Path(DEFAULT_CONFIG_FILE).exists() else None))


def load_settings(config: Path | None = None, **overrides: Any) -> Settings:
    """Build settings, honouring an explicit --config file over LLMPIPE_CONFIG."""
    token = _explicit_config.set(str(Path(config).resolve())) if config is not None else None
    try:
        s = Settings(**{k: v for k, v in overrides.items() if v is not None})
        s._config_file = config_path()
    finally:
        if token is not None:
            _explicit_config.reset(token)
    return s


# (not `kafka`: the embedded broker's children speak PLAINTEXT, and secrets would dump masked)
WORKER_CONFIG_FIELDS = {"stages", "tenants", "tenant_defaults", "auth", "deployments", "engine", "runtime", "consumer"}


def worker_config_yaml(settings: Settings) -> str:
    """The YAML a child `llmpipe worker` needs to run as `settings` describes (the broker, topic
    prefix and data dir travel as LLMPIPE_* environment variables)."""
    import yaml

    return yaml.safe_dump(settings.model_dump(mode="json", by_alias=True, exclude_none=True,
                                              include=WORKER_CONFIG_FIELDS))
