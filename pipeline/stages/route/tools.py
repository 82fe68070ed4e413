"""Tool-candidate narrowing: a request offering more tools than the policy's `max_candidates` keeps
the top-k most relevant to the conversation, so the model reads fewer schemas and picks wrong less.
Narrowing is not authorisation: what a caller may offer and call is checked elsewhere.

How a tool is scored (deterministic for the same tools, conversation and policy):

1. Its text (name split into words, description, parameter names and descriptions) is embedded by
   both encoders, English MiniLM and multilingual USE; vectors are cached by the tool's digest.
2. The conversation gives two queries: the last user turn, and the turns before it (a short "yes, go
   ahead" gets its meaning from them). A tool's score per encoder is sim(last) + context_weight *
   sim(context); its score is the better encoder's.
3. Always kept, before the ranking: a tool named by `tool_choice`, and tools the conversation has
   already called (a follow-up such as "and for the other one?" repeats a call).
4. The rest are ranked by score; ties by name.

A batch of requests encodes its queries once per encoder (`query_vectors`), and the last user turn
of a one-turn request reuses route's own MiniLM vector of the same text (cache_text): the queries
cost one batched call, not two model calls per request.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from pipeline.contracts.request import ChatMessage, NamedToolChoice, Tool
from pipeline.engines.embedder import Embedder
from pipeline.stages.route.config import ToolsPolicy

Encode = Callable[[list[str]], np.ndarray]  # texts -> L2-normalised rows
QueryVectors = dict[str, tuple[np.ndarray, np.ndarray | None]]  # encoder -> (last turn, context or None)
MAX_TOOL_TEXT = 1000  # characters of a tool's text that are embedded (schemas can be long)


@dataclass
class Narrowing:
    kept: list[str]  # in rank order (always-kept first)
    dropped: list[str]
    scores: dict[str, float]
    always: list[str] = field(default_factory=list)  # kept whatever their score, and why


def words(name: str) -> str:
    """get_orderStatus / toggle-feature-flag -> "get order status" / "toggle feature flag"."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name)
    return re.sub(r"[_\-.]+", " ", spaced).lower().strip()


def tool_text(tool: Tool) -> str:
    f = tool.function
    parts = [words(f.name)]
    if f.description:
        parts.append(f.description)
    props = f.parameters.get("properties") if isinstance(f.parameters, dict) else None
    if isinstance(props, dict):
        for pname, spec in props.items():
            desc = spec.get("description") if isinstance(spec, dict) else None
            parts.append(f"{words(pname)}: {desc}" if desc else words(pname))
    return ". ".join(parts)[:MAX_TOOL_TEXT]


def digest(tool: Tool) -> str:
    return hashlib.sha256(orjson.dumps(tool.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


def queries(messages: Sequence[ChatMessage]) -> tuple[str, str]:
    """The last user turn, and the conversation before it (user and assistant text, tool results out:
    they are data, often long, and rarely say what to do next)."""
    last = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].role == "user"), None)
    if last is None:
        return "", ""
    before = [m.content for m in messages[:last] if m.role in ("user", "assistant") and m.content]
    return messages[last].content, "\n".join(before[-4:])


def called(messages: Sequence[ChatMessage]) -> list[str]:
    seen: dict[str, None] = {}
    for m in messages:
        for c in m.tool_calls or ():
            seen.setdefault(c.function.name, None)
    return list(seen)


class ToolNarrower:
    """Thread-safe for reads after construction; the vector cache is bounded (LRU by tool digest)."""

    def __init__(self, encoders: dict[str, Encode], context_weight: float = 0.5, cache_size: int = 4096) -> None:
        self.encoders = encoders
        self.context_weight = context_weight
        self.cache_size = cache_size
        self._vectors: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()

    def _tool_vectors(self, name: str, encode: Encode, tools: Sequence[Tool]) -> np.ndarray:
        keys = [(name, digest(t)) for t in tools]
        missing = [i for i, k in enumerate(keys) if k not in self._vectors]
        if missing:
            for i, vec in zip(missing, encode([tool_text(tools[i]) for i in missing])):
                self._vectors[keys[i]] = vec
        for k in keys:
            self._vectors.move_to_end(k)
        while len(self._vectors) > self.cache_size:
            self._vectors.popitem(last=False)
        return np.stack([self._vectors[k] for k in keys])

    def query_vectors(self, conversations: Sequence[Sequence[ChatMessage]],
                      known: dict[str, list[np.ndarray | None]] | None = None) -> list[QueryVectors]:
        """Each conversation's (last, context) vectors per encoder, one encode call per encoder for the
        whole batch. `known[encoder][i]`: that encoder's vector of conversation i's last turn, already
        computed (None: encode it)."""
        asked = [queries(m) for m in conversations]
        out: list[QueryVectors] = [{} for _ in asked]
        for name, encode in self.encoders.items():
            have = (known or {}).get(name) or [None] * len(asked)
            texts: list[str] = []
            for (last, context), vec in zip(asked, have):
                texts += ([last] if vec is None else []) + ([context] if context else [])
            encoded = iter(encode(texts)) if texts else iter(())
            for i, ((_, context), vec) in enumerate(zip(asked, have)):
                q_last = next(encoded) if vec is None else vec
                out[i][name] = (q_last, next(encoded) if context else None)
        return out

    def scores(self, tools: Sequence[Tool], messages: Sequence[ChatMessage],
               q: QueryVectors | None = None) -> dict[str, float]:
        q = q if q is not None else self.query_vectors([messages])[0]
        best = np.full(len(tools), -np.inf)
        for name, encode in self.encoders.items():
            tv = self._tool_vectors(name, encode, tools)
            q_last, q_context = q[name]
            s = tv @ q_last
            if q_context is not None:
                s = s + self.context_weight * (tv @ q_context)
            best = np.maximum(best, s)
        return {t.function.name: round(float(v), 4) for t, v in zip(tools, best)}

    def narrow(self, tools: Sequence[Tool], messages: Sequence[ChatMessage], k: int,
               choice: Any = None, q: QueryVectors | None = None) -> Narrowing:
        names = [t.function.name for t in tools]
        always = [n for n in called(messages) if n in names]
        if isinstance(choice, NamedToolChoice) and choice.name not in always:
            always.insert(0, choice.name)
        if len(tools) <= k:
            return Narrowing(kept=names, dropped=[], scores={}, always=always)
        scores = self.scores(tools, messages, q)
        ranked = sorted((n for n in names if n not in always), key=lambda n: (-scores[n], n))
        kept = (always + ranked)[:max(k, len(always))]
        return Narrowing(kept=kept, dropped=[n for n in names if n not in kept], scores=scores, always=always)


def narrower_for(policy: ToolsPolicy, minilm: Embedder | None = None) -> ToolNarrower:
    """The narrower with the stack's two shared encoders (loaded on first use); `minilm`: route's
    embedder, whose vectors of the last turn the narrower then reuses."""
    from pipeline.engines.embedder import shared_embedder
    from pipeline.engines.multilingual import shared_multilingual

    minilm, use = minilm or shared_embedder(), shared_multilingual()
    return ToolNarrower({"minilm": lambda texts: minilm.embed(texts), "use": lambda texts: use.encode(texts)},
                        context_weight=policy.context_weight)
