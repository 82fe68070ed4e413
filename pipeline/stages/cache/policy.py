"""The semantic cache's policy as pure functions: boundaries, bypass rules and thresholds (the
verification gate is gate.py, its word lists lexicon.py). No index, no model, no Kafka: every
decision here is replayable.

A hit needs all of: the same boundaries (filtered in the index, so a cross-boundary hit is
impossible by construction), similarity >= the domain's threshold, a fresh entry, and the gate:
cosine alone scores "reset my password" vs "reset my router" at 0.50 while some paraphrases
score 0.50-0.62, so the gate checks that numbers, masked entities, negation and content words
agree before an answer is reused.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache

from pipeline.contracts import RequestDoc
from pipeline.stages.cache.config import CachePolicy
from pipeline.stages.cache.lexicon import (
    ALTERNATIVE,
    NEGATION_COUNT,
    NEGATION_EN,
    NEGATION_KO,
)
from pipeline.stages.cache.tool_results import (
    PLACEHOLDER,
    conversation_turns,
    has_tool_exchange,
    tool_bypass,
    tool_results_digest,
)

# ---- boundaries ------------------------------------------------------------------------------

BOUNDARY_FIELDS = ("tenant", "acl_scope", "model_revision", "prompt_revision", "data_version", "locale",
                   "embedding_revision", "domain")


@dataclass(frozen=True)
class Boundary:
    tenant: str
    acl_scope: str
    model_revision: str
    prompt_revision: str
    data_version: str
    locale: str
    embedding_revision: str
    domain: str

    def as_payload(self) -> dict[str, str]:
        return {f: getattr(self, f) for f in BOUNDARY_FIELDS}


def cache_text(doc: RequestDoc) -> str:
    """What the cache compares: the (masked) user turns; system prompts are part of the prompt revision."""
    return "\n".join(m.content for m in doc.body.messages if m.role == "user").strip()


def detect_domain(doc: RequestDoc, policy: CachePolicy) -> str:
    if doc.context.domain:
        return doc.context.domain
    text = cache_text(doc).lower()
    for name, rule in policy.domains.items():
        if any(k in text for k in rule.keywords):
            return name
    return policy.default_domain


def prompt_revision(doc: RequestDoc, policy: CachePolicy) -> str:
    """The policy's prompt revision, plus a digest of the request's system prompt when it has one:
    the same question under another system prompt is another question."""
    system = "\n".join(m.content for m in doc.body.messages if m.role == "system")
    if not system:
        return policy.prompt_revision
    return f"{policy.prompt_revision}+sys:{hashlib.sha256(system.encode()).hexdigest()[:16]}"


def acl_scope(doc: RequestDoc) -> str | None:
    """The scope an entry is shared in, from who the caller *is* (principal and roles, set by mask
    from the API key), never from what it claims: `context.acl_scope` only picks among the scopes the
    caller holds. `user` or `user:<anyone>` is the caller's own principal; `role:<r>` and
    `group:<r>` need r among the caller's roles. None: a scope the caller does not hold."""
    declared = doc.context.acl_scope.strip()
    kind, _, name = declared.partition(":")
    if kind == "tenant" and not name:
        return "tenant"
    if kind == "user":
        return f"user:{doc.principal}" if doc.principal else None
    if kind in ("role", "group") and name and name in doc.roles:
        return f"role:{name}"
    return None


def boundary_for(doc: RequestDoc, policy: CachePolicy, domain: str, embedding_revision: str) -> Boundary:
    return Boundary(
        tenant=doc.tenant_id or "",
        acl_scope=acl_scope(doc) or "",
        model_revision=policy.model_revision(doc.body.model),
        prompt_revision=prompt_revision(doc, policy),
        data_version=data_version(doc),
        locale=doc.context.locale,
        embedding_revision=embedding_revision,
        domain=domain,
    )


def data_version(doc: RequestDoc) -> str:
    """The caller's data version, plus the digest of the tool results the answer rests on (tool_results.py)."""
    declared = doc.context.data_version or ""
    if not has_tool_exchange(doc):
        return declared
    return f"{declared}+tools:{tool_results_digest(doc)}"



@lru_cache(maxsize=8)
def _volatile_pattern(keywords: tuple[str, ...]) -> re.Pattern[str]:
    parts = [rf"\b{re.escape(k)}\b" if re.fullmatch(r"[a-z][a-z' ]*[a-z]", k) else re.escape(k) for k in keywords]
    return re.compile("|".join(parts) or r"(?!)")


_NEGATED = re.compile("|".join([*NEGATION_COUNT, ALTERNATIVE, *(rf"\b{re.escape(w)}\b" for w in NEGATION_EN),
                                 *(re.escape(k) for k in NEGATION_KO)]))


def negated_or_contrasted(text: str) -> bool:
    """A negation or a contrast anywhere in the prompt (lexicon: NEGATION_*, ALTERNATIVE)."""
    return _NEGATED.search(text.lower()) is not None


def volatile_match(text: str, keywords: tuple[str, ...]) -> str | None:
    """The first volatile keyword in the text (CachePolicy.volatile_keywords), or None."""
    m = _volatile_pattern(keywords).search(text.lower())
    return m.group(0) if m else None


def bypass_reason(doc: RequestDoc, policy: CachePolicy, domain: str) -> str | None:
    """Why this request may neither be served from nor written to the cache (None: it may)."""
    ctx = doc.context
    if doc.rollout is not None:
        return "rollout"  # RL wants fresh samples from the actor, never a stored answer
    if acl_scope(doc) is None:
        return "acl_scope_not_held"  # neither read nor write another principal's or role's entries
    if ctx.personalised:
        return "personalised"
    if ctx.tool_side_effects:
        return "tool_side_effects"
    if has_tool_exchange(doc) and (why := tool_bypass(doc, policy.cache_versioned_tool_results)) is not None:
        return why
    if ctx.volatile:
        return "volatile_data"
    text = cache_text(doc)
    if not text:
        return "no_user_text"
    turns = conversation_turns(doc)
    if len(turns) > 2 or "assistant" in turns:
        return "conversation_context"  # earlier turns change the meaning of the last one
    if doc.body.images:
        return "images"
    if doc.body.output_schema() is not None:
        return "structured_output"  # the answer's shape depends on the schema, which no entry records
    if doc.body.n > 1:
        return "choices"  # an entry is one answer
    if doc.body.stop or doc.body.logit_bias:
        return "sampling_constraints"  # an entry made without them is not the answer they would give
    if not policy.cache_masked_entities and PLACEHOLDER.search(text):
        return "personal_entities"
    rule = policy.domains.get(domain)
    if rule is None or rule.threshold is None:
        return f"domain_not_cached:{domain}"
    if volatile_match(text, tuple(policy.volatile_keywords)):
        return "volatile_keyword"
    if not policy.serve_negated and negated_or_contrasted(text):
        return "negated"
    if doc.body.temperature is not None and doc.body.temperature > 0 and doc.body.seed is None:
        return None  # sampling is fine: a cached answer is one valid sample
    return None
