"""The stage topology: which stages run, in what order, which class implements each, and how
each stage's input topic is keyed. The runtime knows no product stage: the assembly hands it a
catalog (name -> "module:Class") for stages the settings name without a class."""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from collections.abc import Mapping

from pipeline.config.settings import Settings, StageSpec
from pipeline.contracts import RequestDoc
from pipeline.contracts.request import ANONYMOUS_TENANT
from pipeline.runtime.errors import TopologyError
from pipeline.runtime.stage import Stage, StageContext
from pipeline.runtime.topics import TopicNames, TopicSpec, load_registry


def import_object(path: str) -> object:
    """Resolve "package.module:Name"; the working directory is importable, as for uvicorn apps."""
    module_name, _, attr = path.partition(":")
    if not attr:
        raise TopologyError(f"expected 'module:Class', got {path!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TopologyError(f"cannot import {module_name!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise TopologyError(f"{module_name!r} has no {attr!r}") from None


class Topology:
    def __init__(self, settings: Settings, catalog: Mapping[str, str] | None = None,
                 registry: dict[str, TopicSpec] | None = None) -> None:
        """`catalog`: the default stages, in order, used when `settings.stages` is empty, and the
        class of any stage the settings name without one."""
        self.settings = settings
        self.catalog = dict(catalog or {})
        specs = settings.stages or [StageSpec(name=n) for n in self.catalog]
        self.specs: dict[str, StageSpec] = {s.name: s for s in specs}
        self.order = [s.name for s in specs]
        self.registry = registry or load_registry()
        self._classes: dict[str, type[Stage]] = {}
        self.check_chains()
        self.chained = {name: self._chains(prev, name) for prev, name in zip([None, *self.order], self.order)}

    def _chains(self, prev: str | None, name: str) -> bool:
        """Does `name` run in `prev`'s chain? As its spec says; unset, by the registry: the stage's input
        topic marks no boundary and has the same key as the previous stage's."""
        explicit = self.specs[name].chain
        if explicit is not None or prev is None:
            return bool(explicit)
        mine, theirs = self.registry.get(f"stage.{name}"), self.registry.get(f"stage.{prev}")
        return mine is not None and theirs is not None and mine.boundary is None and mine.key == theirs.key

    def head_of(self, name: str) -> str:
        """The first stage of the chain `name` runs in (itself when it is not chained)."""
        i = self.order.index(name)
        while i > 0 and self.chained[self.order[i]]:
            i -= 1
        return self.order[i]

    def require_group(self, name: str) -> None:
        """A worker group is a chain's first stage: a stage inside another's chain has no group of its own
        (one would also consume the chain's topics and decide every jump there twice)."""
        self.spec(name)  # an unknown stage: the topology's error
        head = self.head_of(name)
        if head != name:
            raise TopologyError(f"stage {name!r} runs in the chain of {head!r}: start the workers of {head!r}, or set "
                                f"`chain: false` on {name!r} to scale it alone (docs/design.md, \"Stage chains\")")

    def boundary(self, name: str) -> str:
        """Why `name` starts a chain (`llmpipe topics chains`); empty when it does not."""
        if self.order and name == self.order[0]:
            return "the first stage"
        if self.chained[name]:
            return ""
        if self.specs[name].chain is False:
            return "split by its topology entry (chain: false)"
        spec = self.registry.get(f"stage.{name}")
        prev = self.registry.get(f"stage.{self.order[self.order.index(name) - 1]}")
        if spec is None or prev is None:
            return "not in the topic registry: chains only where it says so (chain: true)"
        if spec.boundary:
            return spec.boundary
        return f"its input is keyed by {spec.key}, the previous stage's by {prev.key}"

    def groups(self) -> list[str]:
        """One worker group per chain, named by its first stage, in pipeline order."""
        return [n for n in self.order if self.head_of(n) == n]

    def chain(self, head: str) -> list[str]:
        """The stages of the chain `head` starts, in order."""
        return [n for n in self.order if self.head_of(n) == head]

    def group_topics(self, head: str, names: TopicNames) -> list[str]:
        """What the worker group of the chain `head` consumes: its first stage's input and side inputs,
        the input of every later stage of the chain (jumps to it land there), and for the first
        stage of the pipeline `requests`, where external producers publish."""
        topics = [names.stage_input(head), *(names(t) for t in self.stage_class(head).side_inputs),
                  *(names.stage_input(m) for m in self.chain(head)[1:])]
        return topics + [names.requests] if head == self.first else topics

    def check_chains(self) -> None:
        """A stage joins the previous one's chain only where its input has the same partition key:
        a key change (admit by tenant, route by device) needs the broker to move the record."""
        for prev, name in zip(self.order, self.order[1:]):
            if not self.specs[name].chain:
                continue  # unset: chained by the registry's rule, which never crosses a key change
            mine, theirs = self.registry.get(f"stage.{name}"), self.registry.get(f"stage.{prev}")
            key, prev_key = (mine.key if mine else "request_id"), (theirs.key if theirs else "request_id")
            if key != prev_key:
                raise TopologyError(f"stage {name!r} cannot chain to {prev!r}: its input is keyed by {key!r}, "
                                    f"{prev!r}'s by {prev_key!r} (a key change needs a topic)")
        if self.order and self.specs[self.order[0]].chain:
            raise TopologyError(f"stage {self.order[0]!r} is first: there is nothing to chain it to")

    def stage_class(self, name: str) -> type[Stage]:
        spec = self.spec(name)
        path = spec.cls or self.catalog.get(name)
        if path is None:
            raise TopologyError(f"stage {name!r} has no implementation (set `class: module:Class`)")
        obj = import_object(path)
        if not (isinstance(obj, type) and issubclass(obj, Stage)):
            raise TopologyError(f"{path} is not a pipeline.runtime.stage.Stage subclass")
        return obj

    def spec(self, name: str) -> StageSpec:
        if name not in self.specs:
            raise TopologyError(f"stage {name!r} is not in the topology ({', '.join(self.order) or 'empty'})")
        return self.specs[name]

    def build(self, name: str, policy: dict | None = None, bootstrap: str | None = None) -> Stage:
        spec = self.spec(name)
        if policy is not None:
            spec = spec.model_copy(update={"policy": policy})
        ctx = StageContext(spec=spec, settings=self.settings, runtime=self.settings.runtime_for(spec),
                           bootstrap=bootstrap or self.settings.bootstrap, topic_prefix=self.settings.topic_prefix)
        return self.stage_class(name)(ctx)

    def topic_registry(self) -> dict[str, TopicSpec]:
        """The registry plus an input topic for every configured stage the registry does not list."""
        out = dict(self.registry)
        template = self.registry.get("stage.mask") or TopicSpec("stage.mask", 6, "request_id", 604800000, "delete", "request")
        for name in self.order:
            topic = f"stage.{name}"
            if topic not in out:
                out[topic] = dataclasses.replace(template, name=topic)
        return out

    @property
    def first(self) -> str:
        if not self.order:
            raise TopologyError("the topology has no stages")
        return self.order[0]

    def next_after(self, name: str) -> str | None:
        i = self.order.index(name)
        return self.order[i + 1] if i + 1 < len(self.order) else None

    def next_for(self, name: str, doc: RequestDoc) -> str | None:
        """The next stage that has work for this request (text-only requests skip media and vision)."""
        i = self.order.index(name)
        for nxt in self.order[i + 1:]:
            cls = self._classes.get(nxt)
            if cls is None:
                cls = self._classes[nxt] = self.stage_class(nxt)
            if cls.applies_to(doc):
                return nxt
        return None

    def keyed_like_requests(self, stage: str) -> bool:
        """Does the stage's input use the `requests` topic's key (request_id)? If not, records
        entering from `requests` must be repartitioned onto its input before it decides."""
        topic = self.registry.get(f"stage.{stage}")
        return topic is None or topic.key == "request_id"

    def key_for(self, stage: str, doc: RequestDoc) -> bytes:
        """Key by the registry's rule for the stage's input topic, e.g. `device_id|request_id`."""
        topic = self.registry.get(f"stage.{stage}")
        rule = topic.key if topic else "request_id"
        for field in rule.split("|"):
            value = getattr(doc, field, None)
            if field == "tenant_id" and not value:
                value = ANONYMOUS_TENANT  # admit meters it under that name: its completions must meet it
            if value:
                return str(value).encode()
        return doc.request_id.encode()
