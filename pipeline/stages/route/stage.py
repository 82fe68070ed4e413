"""route: pick the route (model, adapter, deployments, fallbacks) and the placement, and say why.

The input topic is keyed by device_id when a request carries device state, so one worker owns
each device's hysteresis flags (kept in memory: a rebalance starts a moved device afresh).
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from pipeline.contracts import RequestDoc
from pipeline.contracts.request import RouteSection
from pipeline.engines.embedder import Embedder, ready_shared_embedder
from pipeline.registries.adapters import AdapterRegistry
from pipeline.runtime.stage import Outcome, Stage, StageContext
from pipeline.stages.cache.policy import cache_text
from pipeline.stages.cache.semantic import reused_vector
from pipeline.stages.route.config import RoutePolicy
from pipeline.stages.route.experiments import (
    assign,
    experiment_fields,
    experiment_for,
    with_variant,
)
from pipeline.stages.route.policy import (
    DeviceFlags,
    choose_route,
    place,
    score_routes,
    update_flags,
)
from pipeline.stages.route.tools import ToolNarrower, narrower_for, queries


def route_text(doc: RequestDoc) -> str:
    return cache_text(doc)  # the same text: route can reuse cache's embedding of it


def pick_adapter(doc: RequestDoc, route_adapter: str | None, adapters: AdapterRegistry) -> tuple[str | None, str]:
    """The adapter to run and why. A caller that names a registered adapter as its model gets it
    (admit refuses it if the tenant may not use it); the route's own adapter is used only when the
    tenant may use it, else the base model."""
    asked = doc.body.model
    if asked and asked in adapters.specs:
        return asked, f"adapter {asked} requested by the caller"
    if route_adapter is None:
        return None, ""
    refused = adapters.refusal(doc.tenant_id, route_adapter)
    if refused is not None:
        return None, f"base model: {refused[1]}"
    return route_adapter, f"adapter {route_adapter}"


class Router:
    """The policy plus the embedded exemplars; `decide` is deterministic for (input, policy, flags)."""

    def __init__(self, policy: RoutePolicy, embedder: Embedder, adapters: AdapterRegistry | None = None) -> None:
        self.policy = policy
        self.embedder = embedder
        self.adapters = adapters or AdapterRegistry()
        self.exemplars = {name: embedder.embed(r.exemplars) if r.exemplars else np.zeros((0, embedder.dim))
                          for name, r in policy.routes.items()}
        self.flags: dict[str, DeviceFlags] = {}

    def decide(self, doc: RequestDoc, vec: np.ndarray, now_ms: int) -> RouteSection:
        text = route_text(doc)
        scores = score_routes(text, vec, self.exemplars, self.policy)
        name, reason = choose_route(scores, self.policy)
        route = self.policy.routes[name]
        trial = experiment_for(self.policy.experiments, name)
        drawn = assign(trial, doc.episode_id, doc.request_id) if trial is not None else None
        if drawn is not None:
            route = with_variant(route, drawn.variant)
            reason = f"{reason}; experiment {drawn.experiment}: variant {drawn.variant.name} (per {drawn.reason})"
        adapter, why = pick_adapter(doc, route.adapter, self.adapters)
        if why:
            reason = f"{reason}; {why}"
        flags = DeviceFlags()
        if doc.device_id:
            flags = self.flags[doc.device_id] = update_flags(self.flags.get(doc.device_id, DeviceFlags()),
                                                              doc.device, now_ms, self.policy.placement)
        else:
            flags = update_flags(flags, doc.device, now_ms, self.policy.placement)
        placement, placement_reason = place(flags, doc.device, doc.deadline_ms, now_ms, self.policy.placement)
        return RouteSection(decision=name, reason=reason, model=route.model, adapter=adapter,
                            deployments=route.deployments, fallbacks=route.fallbacks, scores=scores,
                            placement=placement, placement_reason=placement_reason,
                            policy_version=self.policy.version,
                            **(experiment_fields(drawn, self.policy.prompts) if drawn is not None else {}))


class RouteStage(Stage):
    max_batch = 16
    max_wait_ms = 3
    policy_model = RoutePolicy

    def __init__(self, ctx: StageContext) -> None:
        super().__init__(ctx)
        self.router: Router | None = None
        self.narrower: ToolNarrower | None = None  # its encoders load on the first request with many tools

    async def start(self) -> None:
        embedder = await ready_shared_embedder(self.ctx.settings.resolved_data_dir() / "models")
        adapters = AdapterRegistry(self.ctx.settings.adapters)
        self.router = await asyncio.to_thread(Router, self.policy, embedder, adapters)
        self.narrower = narrower_for(self.policy.tools, embedder)
        await self.follow_control(adapters.apply)  # adapters registered or re-stated while running

    def outcome(self, doc: RequestDoc, sec: RouteSection, reused: bool = False) -> Outcome:
        doc = doc.model_copy(update={"route": sec})  # the query vector stays: postprocess's write-back reuses it
        ev = self.evidence(doc, sec.decision, sec.reason,
                           scores={f"route.{k}": v for k, v in sec.scores.items()},
                           candidates=[sec.decision, *sec.fallbacks],
                           revisions={"embedding": self.router.embedder.revision if self.router else ""},
                           labels={"embedding": "reused" if reused else "computed", "adapter": sec.adapter or "",
                                   **({"experiment": sec.experiment, "variant": sec.variant or "",
                                       "assignment": sec.assignment or ""} if sec.experiment else {})})
        placement_ev = self.evidence(doc, f"placement:{sec.placement}", sec.placement_reason)
        # evidence rows are keyed by (request_id, stage, attempt): the placement row is its own stage name
        placement_ev = placement_ev.model_copy(update={"stage": f"{self.name}.placement"})
        if sec.tools_kept is None:
            return Outcome.forward(doc, ev, placement_ev)
        tools_ev = self.evidence(doc, "narrowed", f"kept {len(sec.tools_kept)} of "
                                 f"{len(sec.tools_kept) + len(sec.tools_dropped)} tools",
                                 candidates=sec.tools_kept, scores={"tools.offered": float(len(doc.body.tools)),
                                                                    "tools.kept": float(len(sec.tools_kept)),
                                                                    **{f"tool.{k}": v for k, v in sec.tool_scores.items()}},
                                 labels={"dropped": ",".join(sec.tools_dropped)[:2000]})
        tools_ev = tools_ev.model_copy(update={"stage": f"{self.name}.tools"})
        return Outcome.forward(doc, ev, placement_ev, tools_ev)

    def narrows(self, doc: RequestDoc) -> bool:
        return self.narrower is not None and len(doc.body.tools) > self.policy.tools.max_candidates \
            and doc.body.tool_choice != "none"

    def narrowed_all(self, docs: list[RequestDoc], sections: list[RouteSection],
                     route_vectors: list[np.ndarray]) -> list[RouteSection]:
        """Tool narrowing (route/tools.py) for the requests offering more tools than the policy keeps:
        their queries encoded together, a one-turn request's last turn from route's own vector."""
        todo = [i for i, d in enumerate(docs) if self.narrows(d)]
        if not todo or self.narrower is None:
            return sections
        known = [route_vectors[i] if queries(docs[i].body.messages)[0] == route_text(docs[i]) else None for i in todo]
        qs = self.narrower.query_vectors([docs[i].body.messages for i in todo], {"minilm": known})
        out = list(sections)
        for i, q in zip(todo, qs):
            d = docs[i]
            n = self.narrower.narrow(d.body.tools, d.body.messages, self.policy.tools.max_candidates,
                                     d.body.tool_choice, q)
            out[i] = out[i].model_copy(update={"tools_kept": n.kept, "tools_dropped": n.dropped,
                                               "tool_scores": n.scores})
        return out

    async def process_batch(self, docs: list[RequestDoc]) -> list[Outcome | BaseException]:
        assert self.router is not None, "start() first"
        router = self.router

        def run() -> tuple[list[RouteSection], list[bool]]:
            vecs = [reused_vector(d, router.embedder) for d in docs]
            reused = [v is not None for v in vecs]
            todo = [i for i, v in enumerate(vecs) if v is None]
            if todo:
                for i, v in zip(todo, router.embedder.embed([route_text(docs[i]) for i in todo])):
                    vecs[i] = v
            now = int(time.time() * 1000)
            # the record's own creation time drives hysteresis, so a replay re-decides identically
            sections = [router.decide(d, v, d.created_ms or now) for d, v in zip(docs, vecs)]
            return self.narrowed_all(docs, sections, vecs), reused

        sections, reused = await asyncio.to_thread(run)
        return [self.outcome(d, s, r) for d, s, r in zip(docs, sections, reused)]
