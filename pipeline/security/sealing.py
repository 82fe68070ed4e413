"""The restore mapping (placeholder -> original text) sealed for transport inside the request.

AES-256-GCM with the request_id as associated data, so a sealed mapping cannot be replayed onto
another request. Token: `v1.<key_id>.<base64url(nonce | ciphertext)>`. Only mask seals and only
postprocess opens; neither logs the plaintext. Below: a streamed answer's pieces, sealed by generate
and opened by the caller's client (the door).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

if TYPE_CHECKING:
    from pipeline.config.settings import Settings
    from pipeline.contracts.stream import Delta


class RestoreError(ValueError):
    pass


@dataclass(frozen=True)
class Keyring:
    keys: dict[str, bytes]
    active: str

    def __post_init__(self) -> None:
        if self.active not in self.keys:
            raise RestoreError(f"active mask key {self.active!r} is not in the keyring")
        for kid, key in self.keys.items():
            if len(key) != 32:
                raise RestoreError(f"mask key {kid!r} must be 32 bytes (base64 of 32 random bytes)")

    @classmethod
    def from_b64(cls, keys: dict[str, str], active: str) -> Keyring:
        try:
            return cls({k: base64.b64decode(v) for k, v in keys.items()}, active)
        except (ValueError, TypeError) as exc:
            raise RestoreError(f"mask keys must be base64: {exc}") from None

    @classmethod
    def ephemeral(cls) -> Keyring:
        """A random key that lives in this process only (evaluations and tests: nothing outlives them)."""
        return cls({"ephemeral": secrets.token_bytes(32)}, "ephemeral")

    @classmethod
    def local(cls, directory: Path) -> Keyring:
        """The embedded default: one key generated into DATA_DIR/secrets on first use (mode 0600)."""
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = directory / "mask-local.key"
        if not path.exists():
            # workers, the door and admit start together: write a private file whole, then link it
            # into place; whoever links second reads the first one's key (never a half-written file)
            tmp = directory / f".mask-local.key.{os.getpid()}.{secrets.token_hex(4)}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(base64.b64encode(secrets.token_bytes(32)))
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
        return cls({"local": base64.b64decode(path.read_bytes())}, "local")


def seal(mapping: dict[str, str], request_id: str, keyring: Keyring) -> str:
    nonce = secrets.token_bytes(12)
    ct = AESGCM(keyring.keys[keyring.active]).encrypt(nonce, orjson.dumps(mapping), request_id.encode())
    return f"v1.{keyring.active}.{base64.urlsafe_b64encode(nonce + ct).decode()}"


def open_sealed(token: str, request_id: str, keyring: Keyring) -> dict[str, str]:
    try:
        version, kid, body = token.split(".", 2)
    except ValueError:
        raise RestoreError("malformed restore token") from None
    if version != "v1":
        raise RestoreError(f"unknown restore token version {version!r}")
    key = keyring.keys.get(kid)
    if key is None:
        raise RestoreError(f"restore token sealed with unknown key {kid!r}")
    try:
        raw = base64.urlsafe_b64decode(body)
    except (ValueError, TypeError):  # binascii.Error is a ValueError
        raise RestoreError("malformed restore token") from None
    try:
        plain = AESGCM(key).decrypt(raw[:12], raw[12:], request_id.encode())
    except InvalidTag:
        raise RestoreError("restore token does not open for this request (tampered, or another request's)") from None
    return orjson.loads(plain)


def unmask(text: str, mapping: dict[str, str]) -> str:
    # longest placeholders first: <PERSON_10> must not be cut by <PERSON_1>
    for placeholder in sorted(mapping, key=len, reverse=True):
        text = text.replace(placeholder, mapping[placeholder])
    return text


def keyring_for(settings: Settings) -> Keyring:
    """Configured keys (settings.secrets), else the data dir's local key."""
    sec = settings.secrets
    if sec.mask_keys:
        active = sec.mask_active_key or next(iter(sec.mask_keys))
        return Keyring.from_b64({k: v.get_secret_value() for k, v in sec.mask_keys.items()}, active)
    return Keyring.local(settings.resolved_data_dir() / "secrets")


# ---- deltas (issue 35, finding 8) ---------------------------------------------------------------
# A streamed answer's pieces travel on `deltas`, one partition for every caller whose reply partition
# has that number: un-masked text of many requests and tenants. Sealed, a reader of the topic sees
# the ids, sizes and times, never the text or its tokens. Key: HMAC-SHA256(keyring key, purpose +
# request_id), so a delta key opens one request's pieces and nothing else of the keyring's (restore
# mappings, assertions). Associated data: the delta's place (request, tenant, attempt, seq, last), so
# a sealed piece cannot be moved to another request or position. Token: `d1.<key id>.<b64url(nonce|ct)>`.

DELTA_VERSION = "d1"
_DELTA_PURPOSE = b"llmpipe delta v1\x00"


def delta_key(keyring: Keyring, kid: str, request_id: str) -> bytes:
    key = keyring.keys.get(kid)
    if key is None:
        raise RestoreError(f"delta sealed with unknown key {kid!r}")
    return hmac.new(key, _DELTA_PURPOSE + request_id.encode(), hashlib.sha256).digest()


def _delta_aad(d: Delta) -> bytes:
    return orjson.dumps([d.request_id, getattr(d, "tenant_id", None), d.attempt, d.seq, d.last])


class DeltaSealer:
    """Seals the deltas of one request (the key is derived once, at the first piece)."""

    def __init__(self, keyring: Keyring, request_id: str) -> None:
        self.kid = keyring.active
        self._aead = AESGCM(delta_key(keyring, self.kid, request_id))

    def seal(self, d: Delta) -> Delta:
        nonce = secrets.token_bytes(12)
        plain = orjson.dumps({"text": d.text, "token_ids": d.token_ids, "logprobs": d.logprobs})
        ct = self._aead.encrypt(nonce, plain, _delta_aad(d))
        token = f"{DELTA_VERSION}.{self.kid}.{base64.urlsafe_b64encode(nonce + ct).decode()}"
        return d.model_copy(update={"text": "", "token_ids": [], "logprobs": None, "sealed": token})


def open_delta(d: Delta, keyring: Keyring) -> Delta:
    """The delta with its text, tokens and logprobs back; a plain delta as it is. RestoreError when
    it does not open (another key, another request or place, tampered)."""
    if d.sealed is None:
        return d
    try:
        version, kid, body = d.sealed.split(".", 2)
        raw = base64.urlsafe_b64decode(body)
    except (ValueError, TypeError):
        raise RestoreError("malformed sealed delta") from None
    if version != DELTA_VERSION:
        raise RestoreError(f"unknown sealed delta version {version!r}")
    try:
        plain = AESGCM(delta_key(keyring, kid, d.request_id)).decrypt(raw[:12], raw[12:], _delta_aad(d))
    except InvalidTag:
        raise RestoreError("sealed delta does not open for this request (tampered, or another request's)") from None
    fields = orjson.loads(plain)
    return d.model_copy(update={"text": fields["text"], "token_ids": fields["token_ids"],
                                "logprobs": fields["logprobs"], "sealed": None})
