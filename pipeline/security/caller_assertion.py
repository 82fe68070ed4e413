"""The front door's signed word for who the caller is, so an API key never rests on a topic.

The door verifies the key, then publishes the request with an assertion instead of the key:
`a1.<keyring key id>.<base64url(claims)>.<base64url(mac)>`. mask verifies it and strips it.

1. Claims: tenant, principal, roles and key id of the verified key.
2. The MAC (HMAC-SHA256, with a subkey derived from the mask keyring's key, which door and mask
   already share for restore mappings) covers the claims *and* the request: its request_id, body,
   context and idempotency key (for feedback: its id, target, metric and value). Whoever reads `requests` can neither reuse an assertion for
   another request nor change what an asserted request asks (a verbatim copy is a duplicate of
   the same request_id, which the pipeline already answers once).
3. mask checks the key id against the live registry too: a key revoked between door and mask is
   refused, as before.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

import orjson

from pipeline.contracts import RequestDoc
from pipeline.contracts.feedback import Feedback
from pipeline.registries.tenants import Caller
from pipeline.security.sealing import Keyring

VERSION = "a1"
_PURPOSE = b"llmpipe caller assertion v1"


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
    return orjson.dumps({"request_id": doc.request_id, "body": doc.body.model_dump(mode="json"),
                         "context": doc.context.model_dump(mode="json"), "idempotency_key": doc.idempotency_key},
                        option=orjson.OPT_SORT_KEYS)


def _signed_part(doc: RequestDoc | Feedback, kid: str, claims: bytes) -> bytes:
    return b"\x00".join((VERSION.encode(), kid.encode(), claims, hashlib.sha256(_subject(doc)).digest()))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign(doc: RequestDoc | Feedback, caller: Caller, keyring: Keyring) -> str:
    """Step 1-2: the assertion for `doc` (fully built: body, context and idempotency key final)."""
    claims = orjson.dumps({"t": caller.tenant, "p": caller.principal, "r": list(caller.roles), "k": caller.key_id})
    mac = hmac.new(_subkey(keyring, keyring.active), _signed_part(doc, keyring.active, claims), hashlib.sha256)
    return f"{VERSION}.{keyring.active}.{_b64(claims)}.{_b64(mac.digest())}"


def verify(token: str, doc: RequestDoc | Feedback, keyring: Keyring) -> Caller:
    """The caller the door vouched for, for exactly this request; AssertionRefused otherwise."""
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
    return Caller(tenant=c["t"], principal=c["p"], roles=tuple(c["r"]), key_id=c["k"])
