"""The request document: one growing JSON document that flows through the stages.

Each stage owns one section and fills it; sections are None until their stage has run.
Later issues give the sections their full shape; the runtime needs only the envelope.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pipeline.contracts.base import WireModel, now_ms
from pipeline.contracts.caller_schema import caller_schema_problem

REQUEST_SCHEMA: Final = "request/v1"
EPISODE_ID = r"^[A-Za-z0-9_.:-]{1,128}$"  # an id, never free text: it lands in every warehouse table
# The tenant of a request that names none (auth off, or published past mask): metered by the
# stack's tenant defaults and scoped like any other tenant, never "no tenant, no limits".
ANONYMOUS_TENANT = "anonymous"


class ReplyTo(WireModel):
    """Where the terminal answer goes: the caller owns (or shares) this partition."""

    topic: str
    partition: int = Field(ge=0)
    stream: bool = Field(False, description="also send the answer as it is generated: delta/v1 records on "
                                            "`deltas`, this same partition number")


TOOL_NAME = r"^[A-Za-z0-9_-]{1,64}$"  # OpenAI's rule for a function name
MAX_TOOLS = 128  # OpenAI's limit per request


class ToolFunction(WireModel):
    """A function the caller offers the model; its parameters are bounded like a response_format schema."""

    name: str = Field(pattern=TOOL_NAME)
    description: str | None = Field(None, max_length=4096)
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _bounded(cls, schema: dict[str, Any]) -> dict[str, Any]:
        if (problem := caller_schema_problem(schema)) is not None:
            raise ValueError(problem)
        return schema


class Tool(WireModel):
    type: Literal["function"] = "function"
    function: ToolFunction


class FunctionCall(WireModel):
    name: str = Field(max_length=64)
    arguments: str = Field("{}", max_length=65_536, description="JSON text, as OpenAI sends it")


class ToolCall(WireModel):
    """A call the model made (an assistant message's, or an answer's)."""

    id: str = Field(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")
    type: Literal["function"] = "function"
    function: FunctionCall


class NamedToolChoice(WireModel):
    type: Literal["function"] = "function"
    function: dict[Literal["name"], str]

    @property
    def name(self) -> str:
        return self.function["name"]


class ChatMessage(WireModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: list[ToolCall] | None = Field(None, description="an assistant message's calls")
    tool_call_id: str | None = Field(None, max_length=64, description="a tool message: the call it answers")


class JsonSchemaFormat(WireModel):
    name: str = Field("output", max_length=64)
    schema_: dict[str, Any] = Field(alias="schema", description="the JSON Schema the answer must satisfy: "
                                                                "self-contained (local $ref only), bounded in size")
    strict: bool = True

    @field_validator("schema_")
    @classmethod
    def _bounded(cls, schema: dict[str, Any]) -> dict[str, Any]:
        problem = caller_schema_problem(schema)
        if problem is not None:
            raise ValueError(problem)
        return schema


class ResponseFormat(WireModel):
    """OpenAI's response_format: free text, or an answer that must satisfy a JSON Schema."""

    type: Literal["text", "json_schema"] = "text"
    json_schema: JsonSchemaFormat | None = None


class ChatBody(WireModel):
    """The caller's ask, in OpenAI chat-completions terms."""

    messages: list[ChatMessage] = Field(min_length=1)
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = None
    images: list[str] = Field(default_factory=list, description="image URLs (fetched by media)")
    logprobs: bool = Field(False, description="return one logprob per generated token")
    top_logprobs: int = Field(0, ge=0, le=20, description="with logprobs: the most likely tokens at each position")
    response_format: ResponseFormat | None = None
    n: int = Field(1, ge=1, le=8, description="answers to generate (choices)")
    stop: list[str] = Field(default_factory=list, max_length=4, description="stop sequences (OpenAI's limit: 4)")
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[int, float] | None = Field(None, description="token id -> bias in [-100, 100], at most 300")
    tools: list[Tool] = Field(default_factory=list, max_length=MAX_TOOLS)
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop: list[str]) -> list[str]:
        if any(not x or len(x) > 256 for x in stop):
            raise ValueError("each stop sequence must be 1-256 characters")
        return stop

    @field_validator("logit_bias")
    @classmethod
    def _biases(cls, bias: dict[int, float] | None) -> dict[int, float] | None:
        if bias is not None and (len(bias) > 300 or any(not -100 <= v <= 100 or k < 0 for k, v in bias.items())):
            raise ValueError("logit_bias: at most 300 token ids (>= 0), each biased by -100 to 100")
        return bias

    @model_validator(mode="after")
    def _tools_agree(self) -> ChatBody:
        names = [t.function.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ValueError("tool names must be unique")
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice) and choice.name not in names:
            raise ValueError(f"tool_choice names {choice.name!r}, which is not among the tools")
        if choice == "required" and not names:
            raise ValueError("tool_choice 'required' needs tools")
        calls: set[str] = set()
        for m in self.messages:
            if m.tool_calls and m.role != "assistant":
                raise ValueError("only an assistant message carries tool_calls")
            calls |= {c.id for c in m.tool_calls or ()}
            if m.role == "tool" and m.tool_call_id not in calls:
                raise ValueError("a tool message must answer an earlier assistant tool call (tool_call_id)")
        return self

    def output_schema(self) -> dict[str, Any] | None:
        rf = self.response_format
        return rf.json_schema.schema_ if rf is not None and rf.type == "json_schema" and rf.json_schema else None


class Section(BaseModel):
    """A stage's section. Open until the owning issue pins it down; always JSON-serialisable."""

    model_config = ConfigDict(extra="allow")

    decision: str | None = None
    reason: str | None = None


class RequestContext(WireModel):
    """What the caller declares about the request: the cache's boundaries and bypass reasons."""

    locale: str = "en"
    region: str | None = None
    acl_scope: str = Field("tenant", description="tenant | user:<id> | role:<name> | group:<name>")
    data_version: str | None = Field(None, description="version of the tools/data the answer depends on")
    tool_versions: dict[str, str] | None = Field(
        None, max_length=64, description="the version of each tool result in the conversation, by tool_call_id or "
                                         "tool name (an opted-in cache keeps such answers under those versions)")
    domain: str | None = Field(None, description="caller's domain hint (faq, payments, ...)")
    personalised: bool = False
    tool_side_effects: bool = False
    volatile: bool = Field(False, description="depends on live data (balances, delivery status)")
    residency: list[str] | None = Field(None, description="regions allowed to process the request (None: any)")
    max_cost_usd: float | None = Field(None, ge=0, description="refuse deployments whose estimated cost is higher")

    @field_validator("tool_versions")
    @classmethod
    def _short_versions(cls, versions: dict[str, str] | None) -> dict[str, str] | None:
        if versions and any(not 0 < len(k) <= 64 or not 0 < len(v) <= 128 for k, v in versions.items()):
            raise ValueError("tool_versions: keys are 1-64 characters, versions 1-128")
        return versions


class CacheSection(WireModel):
    """Filled by cache: what was looked up, what was found, and why it was (not) served."""

    decision: Literal["hit", "miss", "bypass", "shadow_hit"]
    reason: str
    mode: Literal["on", "shadow", "off"]
    domain: str
    threshold: float | None = None
    candidate_id: str | None = None
    similarity: float | None = None
    gate: dict[str, bool] = Field(default_factory=dict)
    verifier_p: float | None = Field(None, description="the verifier's probability that the candidate asks the same")
    verifier_revision: str | None = None
    answer: str | None = Field(None, description="the cached answer: served on a hit; on a shadow hit never "
                                                 "served, only compared with the generated answer by postprocess")
    policy_version: str
    embedding_revision: str | None = None
    query_embedding: str | None = Field(None, description="base64 float32 embedding of the user text "
                                                          "(embedding_revision): route and the cache write-back reuse it")


class DeviceState(WireModel):
    """What an edge device reports with a request; route places the request from it."""

    battery_pct: float | None = Field(None, ge=0, le=100)
    temperature_c: float | None = None
    network_rtt_ms: float | None = Field(None, ge=0)
    privacy_local_only: bool = Field(False, description="raw data must not leave the device")


class RouteSection(WireModel):
    """Filled by route: which route, model, adapter and placement, with the scores behind them."""

    decision: str = Field(description="the chosen route")
    reason: str
    model: str
    adapter: str | None = None
    deployments: list[str] = Field(default_factory=list, description="candidates, in preference order")
    fallbacks: list[str] = Field(default_factory=list, description="routes to try when this one fails")
    scores: dict[str, float] = Field(default_factory=dict)
    placement: Literal["local", "cloud", "degraded"] = "cloud"
    placement_reason: Literal["privacy", "deadline", "network", "thermal", "quality"] = "quality"
    policy_version: str
    experiment: str | None = Field(None, description="the experiment this request was assigned in")
    variant: str | None = None
    assignment: Literal["episode", "request"] | None = Field(None, description="the unit the variant was drawn for")
    system_prompt: str | None = Field(None, description="the variant's system prompt, put before the caller's messages")
    prompt_revision: str | None = None
    tools_kept: list[str] | None = Field(None, description="tool narrowing: the offered tools the model sees "
                                                           "(None: all of them)")
    tools_dropped: list[str] = Field(default_factory=list)
    tool_scores: dict[str, float] = Field(default_factory=dict, description="each offered tool's relevance")


class HookSpec(WireModel):
    """A registered verifier or reward function (pipeline/stages/generate/rollouts/rewards.py) and its arguments."""

    name: str = Field(min_length=1, max_length=128)
    args: dict[str, Any] = Field(default_factory=dict)


class RolloutRequest(WireModel):
    """An RL producer's request for `n` samples of one prompt (request kind `rollout`). Each sample
    becomes a `rollouts` row with its provenance; the caller's answer summarises them."""

    group_id: str = Field(min_length=1, max_length=128, description="samples compared with each other (GRPO group)")
    n: int = Field(1, ge=1, le=64)
    prompt_dataset_revision: str = Field("", max_length=128)
    actor_revision: str | None = Field(None, max_length=256,
                                       description="sample only from this actor revision; refuse otherwise")
    verifier: HookSpec | None = None
    reward: HookSpec | None = None
    reference_revision: str = Field("", max_length=128, description="the reference policy the trainer will use")


class SampleSummary(WireModel):
    sample_id: str
    text: str
    tokens_out: int
    finish_reason: str
    verified: bool | None = None
    score: float | None = None


class Choice(WireModel):
    """One more answer of a request that asked for `n` > 1 (choice 0 is the section's own text)."""

    index: int = Field(ge=1)
    text: str
    tool_calls: list[ToolCall] | None = None
    finish_reason: str


class GenerationSection(WireModel):
    """Filled by generate: what the model produced and what it cost, on which deployment."""

    deployment: str
    model: str
    model_revision: str
    adapter: str | None = Field(None, description="the LoRA adapter the engine applied (None: the base model)")
    text: str
    tool_calls: list[ToolCall] | None = Field(None, description="the model's calls (finish_reason tool_calls)")
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[str, float]]] | None = Field(
        None, description="per generated token, the most likely tokens (text, logprob) when asked for")
    finish_reason: str
    tokens_in: int
    tokens_out: int
    ttft_ms: float
    tpot_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_max_ms: float | None = None
    engine_queue_ms: float | None = Field(None, description="time in the engine's queue (in-process vLLM only)")
    attempts: int = Field(1, description="engine attempts, across retries and fallbacks")
    fallback_from: list[str] = Field(default_factory=list, description="deployments tried before this one")
    cost_usd: float = 0.0
    actor_revision: str = Field("", description="the weights that produced it: model revision (+ adapter@revision)")
    samples: list[SampleSummary] = Field(default_factory=list, description="rollouts: every sample, scored")
    choices: list[Choice] = Field(default_factory=list, description="n > 1: the answers after the first")


class AdmissionSection(WireModel):
    """Filled by admit: what was reserved for the request and how long it waited for it."""

    decision: Literal["admitted"]
    reason: str
    tokens_reserved: int = Field(ge=0, description="prompt tokens + max_tokens")
    cost_reserved_usd: float = Field(ge=0, description="worst case over the deployments it may run on")
    waited_ms: int = Field(0, ge=0, description="time in the tenant's wait queue")
    metered: bool = Field(True, description="always true now (an unconfigured tenant gets the defaults); "
                                            "false in rows from before that")
    deployment: str | None = Field(None, description="the deployment whose limits admitted it (None: none apply)")
    deployments: list[str] = Field(default_factory=list,
                                   description="where generate may run it, in order: the admitted deployment, then "
                                               "only deployments without limits (a fallback never bypasses a limit)")
    policy_version: str


class ImageInfo(WireModel):
    """One image as media received and decoded it: its shape, never its pixels (those are blobs)."""

    index: int
    source: Literal["url", "data", "blob"]
    kind: str = Field(description="sniffed from the bytes: jpeg | png | gif | webp | bmp")
    sha256: str
    bytes: int
    width: int
    height: int
    reduced: int = Field(1, description="libjpeg scale-down used while decoding (1, 2, 4, 8)")
    fetch_ms: float = 0.0
    decode_ms: float = 0.0
    redirects: int = 0
    raw_ref: str = Field(description="blob reference of the encoded bytes")
    tensor_ref: str = Field(description="blob reference of the processor's output (float32 .npy)")


class MediaSection(WireModel):
    """Filled by media: every image fetched, checked and decoded, stored as claim checks."""

    images: list[ImageInfo]
    processor_revision: str
    policy_version: str


class ImageFeatures(WireModel):
    index: int
    labels: list[str] = Field(description="top ImageNet labels, best first")
    scores: list[float]
    embedding_ref: str = Field(description="blob reference of the L2-normalised embedding (float32 .npy)")
    cache: Literal["hit", "miss"]


class VisionSection(WireModel):
    """Filled by vision: features per image, and the description a text-only model gets instead."""

    images: list[ImageFeatures]
    encoder_revision: str
    processor_revision: str
    template_revision: str
    description: str = Field(description="placed before the user's last message for text-only models")
    policy_version: str


class MaskingSection(WireModel):
    """Filled by mask. Entity texts never appear here: only counts, and the sealed restore mapping."""

    decision: Literal["masked", "clean"]
    reason: str
    entity_counts: dict[str, int] = Field(default_factory=dict)
    policy_version: str
    engine_revision: str
    restore_token: str | None = Field(None, description="AES-GCM sealed placeholder->original map; postprocess only")


class StageTiming(WireModel):
    stage: str
    enqueued_ms: int = Field(description="record timestamp of the input record")
    started_ms: int
    finished_ms: int
    queue_ms: float
    service_ms: float
    worker: str | None = None


class RequestDoc(WireModel):
    schema_: Literal["request/v1"] = Field(REQUEST_SCHEMA, alias="schema")
    request_id: str = Field(min_length=1, max_length=128)
    tenant_id: str | None = Field(None, max_length=128)
    principal: str | None = None
    roles: list[str] = Field(default_factory=list, description="the caller's roles, from its API key")
    key_id: str | None = Field(None, description="first 12 hex of the API key's SHA-256 (set by mask)")
    # Carried only on events published straight to Kafka; mask verifies and strips it.
    api_key: str | None = None
    caller_assertion: str | None = Field(None, description="the front door's signed statement of the verified "
                                                           "caller, for this request only (the key never travels); "
                                                           "mask verifies and strips it")
    created_ms: int = Field(default_factory=now_ms)
    deadline_ms: int | None = Field(None, description="epoch ms after which nobody waits")
    attempt: int = Field(0, ge=0, description="caller's retry number of this request_id")
    idempotency_key: str | None = None
    episode_id: str | None = Field(None, pattern=EPISODE_ID, description="groups the requests of one episode "
                                   "(a conversation, an agent run): experiments assign per episode, and "
                                   "feedback may target it")
    device_id: str | None = None
    device: DeviceState | None = None
    traceparent: str | None = None
    cancel_digest: str | None = Field(None, pattern=r"^[0-9a-f]{64}$", description="SHA-256 (hex) of the secret a "
                                      "`cancel` record must carry to withdraw this request: only its sender knows "
                                      "it (runtime/follow/cancels.py); none: no record can cancel it")
    origin: str | None = Field(None, description="`<partition>:<offset>` of the `requests` record it entered by, "
                                                 "set by the runtime (a producer's value is replaced): admit tells a "
                                                 "redelivered copy of a request from a replayed one by it")
    reply_to: ReplyTo | None = None
    body: ChatBody
    context: RequestContext = Field(default_factory=RequestContext)
    rollout: RolloutRequest | None = Field(None, description="set: an RL rollout request (n scored samples)")
    # stage sections, in pipeline order
    masking: MaskingSection | None = None
    cache: CacheSection | None = None
    route: RouteSection | None = None
    admission: AdmissionSection | None = None
    media: MediaSection | None = None
    vision: VisionSection | None = None
    generation: GenerationSection | None = None
    result: Section | None = None
    timings: list[StageTiming] = Field(default_factory=list)
    # free-form labels for tests and replays (never PII)
    labels: dict[str, Any] = Field(default_factory=dict)

    def prompt_text(self) -> str:
        return "\n".join(m.content for m in self.body.messages)
