"""The front door's signed word for who the caller is, so an API key never rests on a topic.

The door verifies the key, then publishes the request with an assertion instead of the key:
`a2.<keyring key id>.<base64url(claims)>.<base64url(mac)>`. mask verifies it and strips it.

1. Claims: tenant, principal, roles and key id of the verified key, and when it was issued.
2. The MAC (HMAC-SHA256, with a subkey derived from the mask keyring's key, which door and mask
   already share for restore mappings) covers the claims *and* the request: the whole document as
   the door built it (reply_to, deadline, rollout, episode, device, labels, attempt, traceparent,
   body, context, idempotency key...), all but what mask sets or drops itself (UNSIGNED); for
   feedback: its id, target, metric and value. Signing everything but a named few means a field
   added later is covered without anyone remembering to add it. Whoever reads `requests` can
   neither reuse an assertion for another request nor change anything in an asserted one.
3. A request's assertion expires (`max_age_ms`, mask's policy): a captured request cannot be
   replayed later; within that age admit refuses a second copy of an id it already took.
4. mask checks the key id against the live registry too: a key revoked between door and mask is
   refused, as before.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from typing import Any

import orjson

from pipeline.contracts import RequestDoc
from pipeline.contracts.feedback import Feedback
from pipeline.registries.tenants import Caller
from pipeline.security.sealing import Keyring

VERSION = "a2"  # a1 signed only request_id, body, context and idempotency key
_PURPOSE = b"llmpipe caller assertion v1"
# What the door does not vouch for: the key or assertion itself, the caller mask fills in from the
# key, where the record entered (set by the runtime), and the stage sections mask drops on entry.
UNSIGNED = frozenset({"api_key", "caller_assertion", "principal", "roles", "key_id", "origin", "masking", "cache",
                      "route", "admission", "media", "vision", "generation", "result", "timings"})
MAX_SKEW_MS = 60_000  # an assertion issued this far in the future still verifies (clocks of door and mask)


class AssertionRefused(ValueError):
    pass


def _subkey(keyring: Keyring, kid: str) -> bytes:
    key = keyring.keys.get(kid)
    if key is None:
        raise AssertionRefused("signed with an unknown key")
    return hmac.new(key, _PURPOSE, hashlib.sha256).digest()


def _subject(doc: RequestDoc | Feedback) -> bytes:
    """What an assertion vouches for: a request as it asks, or a piece of feedback as it says."""
    if isinstance(doc, Feedback):
        return orjson.dumps({"feedback": doc.feedback_id, "request_id": doc.request_id, "episode_id": doc.episode_id,
                             "metric": doc.metric, "value": doc.value}, option=orjson.OPT_SORT_KEYS)
    return orjson.dumps(doc.model_dump(mode="json", by_alias=True, exclude=set(UNSIGNED)), option=orjson.OPT_SORT_KEYS)


def _signed_part(doc: RequestDoc | Feedback, kid: str, claims: bytes) -> bytes:
    return b"\x00".join((VERSION.encode(), kid.encode(), claims, hashlib.sha256(_subject(doc)).digest()))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign(doc: RequestDoc | Feedback, caller: Caller, keyring: Keyring, *, now_ms: int | None = None) -> str:
    """Step 1-2: the assertion for `doc`, fully built (nothing signed may change after this)."""
    claims = orjson.dumps({"t": caller.tenant, "p": caller.principal, "r": list(caller.roles), "k": caller.key_id,
                           "i": now_ms if now_ms is not None else int(time.time() * 1000)})
    mac = hmac.new(_subkey(keyring, keyring.active), _signed_part(doc, keyring.active, claims), hashlib.sha256)
    return f"{VERSION}.{keyring.active}.{_b64(claims)}.{_b64(mac.digest())}"


def verify(token: str, doc: RequestDoc | Feedback, keyring: Keyring, *, max_age_ms: int | None = None,
           now_ms: int | None = None) -> Caller:
    """The caller the door vouched for, for exactly this request and (with `max_age_ms`) issued
    within that many ms; AssertionRefused otherwise."""
    try:
        version, kid, claims_b64, mac_b64 = token.split(".")
        claims, mac = _unb64(claims_b64), _unb64(mac_b64)
    except ValueError:  # also binascii.Error
        raise AssertionRefused("malformed caller assertion") from None
    if version != VERSION:
        raise AssertionRefused(f"unknown caller assertion version {version[:8]!r}")
    expected = hmac.new(_subkey(keyring, kid), _signed_part(doc, kid, claims), hashlib.sha256).digest()
    if not hmac.compare_digest(expected, mac):
        raise AssertionRefused("the caller assertion does not match this request")
    c: Any = orjson.loads(claims)
    if max_age_ms is not None:  # step 3
        now = now_ms if now_ms is not None else int(time.time() * 1000)
        issued = c.get("i")
        if not isinstance(issued, int) or issued > now + MAX_SKEW_MS:
            raise AssertionRefused("the caller assertion has no valid issue time")
        if now - issued > max_age_ms:
            raise AssertionRefused(f"the caller assertion expired ({(now - issued) // 1000} s old, "
                                   f"at most {max_age_ms // 1000} s): send the request again")
    return Caller(tenant=c["t"], principal=c["p"], roles=tuple(c["r"]), key_id=c["k"])
