"""The route stage's policy model (parse-only): the routes (model, adapter, deployments, fallbacks,
exemplars, keywords, complexity band), the score weights, placement thresholds with hysteresis, and
the experiments with their prompt revisions (checked to fit the routes when the policy loads)."""

from __future__ import annotations

from pydantic import Field, model_validator

from pipeline.config.policy import PolicyModel
from pipeline.stages.route.experiments import Experiment


class Route(PolicyModel):
    model: str
    adapter: str | None = None
    deployments: list[str] = Field(default_factory=list)
    fallbacks: list[str] = Field(default_factory=list, description="other routes, in order")
    exemplars: list[str] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)
    complexity: tuple[float, float] = Field((0.0, 1.0), description="the complexity band this route serves")


# The embedded stack has one deployment, so every route runs on it; at scale, point `reasoning` at a
# large model's deployments (the report shows requested vs executed model).
def _default_routes() -> dict[str, Route]:
    return {
        "simple": Route(model="small", deployments=["local-vllm"], fallbacks=["reasoning"],
                        exemplars=["What are your opening hours?", "Say hello", "Translate 'thank you' to Korean",
                                   "영업시간 알려줘", "고마워요"],
                        complexity=(0.0, 0.35)),
        "support": Route(model="small", adapter="support-lora", deployments=["local-vllm"],
                         fallbacks=["simple", "reasoning"],
                         exemplars=["How do I reset my password?", "I want a refund for my order",
                                    "My package has not arrived", "비밀번호를 잊어버렸어요", "환불 받고 싶어요"],
                         keywords=["refund", "order", "password", "account", "delivery", "환불", "주문", "배송", "계정"],
                         complexity=(0.0, 0.7)),
        "reasoning": Route(model="large", deployments=["local-vllm"], fallbacks=["support", "simple"],
                           exemplars=["Explain step by step why the proof works",
                                      "Compare these two architectures and recommend one with trade-offs",
                                      "Write a detailed plan to migrate our database",
                                      "단계별로 이유를 설명해 주세요"],
                           keywords=["why", "explain", "compare", "analyze", "analyse", "step by step", "plan",
                                     "prove", "설명", "비교", "분석"],
                           complexity=(0.45, 1.0)),
    }


class PlacementPolicy(PolicyModel):
    thermal_high_c: float = 42.0
    thermal_low_c: float = 38.0
    rtt_high_ms: float = 400.0
    rtt_low_ms: float = 200.0
    battery_low_pct: float = 15.0
    battery_ok_pct: float = 25.0
    min_hold_ms: int = 30_000
    # below this much time to the deadline a cloud round trip cannot make it
    cloud_min_budget_ms: int = 1_500


class ToolsPolicy(PolicyModel):
    """Tool-candidate narrowing (route/tools.py)."""

    max_candidates: int = Field(8, ge=1, le=128, description="a request offering more tools keeps this many")
    context_weight: float = Field(0.5, ge=0, description="weight of the turns before the last user turn")


class RoutePolicy(PolicyModel):
    version: str = "route-v1"
    routes: dict[str, Route] = Field(default_factory=_default_routes)
    default_route: str = "simple"
    weight_embedding: float = 0.6
    weight_keyword: float = 0.25
    weight_complexity: float = 0.15
    min_score: float = 0.25
    placement: PlacementPolicy = PlacementPolicy()
    tools: ToolsPolicy = ToolsPolicy()
    experiments: list[Experiment] = Field(default_factory=list, description="weighted variants of routes")
    prompts: dict[str, str] = Field(default_factory=dict, description="prompt revision -> the system prompt a "
                                                                      "variant runs with")

    @model_validator(mode="after")
    def _experiments_fit(self) -> RoutePolicy:
        on_route: dict[str, str] = {}
        for e in self.experiments:
            if e.route not in self.routes:
                raise ValueError(f"experiment {e.name}: no route {e.route!r} (routes: {sorted(self.routes)})")
            if e.enabled and e.route in on_route:
                raise ValueError(f"experiments {on_route[e.route]} and {e.name} both split route {e.route!r}")
            if e.enabled:
                on_route[e.route] = e.name
            for v in e.variants:
                if v.prompt_revision is not None and v.prompt_revision not in self.prompts:
                    raise ValueError(f"experiment {e.name}, variant {v.name}: prompt revision "
                                     f"{v.prompt_revision!r} is not among the policy's prompts")
        return self
