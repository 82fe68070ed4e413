"""Fetching one image over HTTP(S) under the SSRF guard (guard.py).

Per hop: vet the URL, resolve the host once, vet every address, connect to the first vetted
address ourselves (Host header and TLS SNI carry the name, so certificates are still checked
against it), never follow a redirect automatically (each Location is vetted as a new URL), send no
cookies or credentials and read no proxy settings, ask for identity encoding (no decompression
bombs), stop reading at the byte limit, and bound the whole fetch by a total deadline (a slow
drip never outlives it). The content type is sniffed from the bytes, never taken from headers.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from dataclasses import dataclass
from urllib.parse import urljoin

import httpx

from pipeline.stages.media.config import FetchLimits, FetchRules
from pipeline.stages.media.guard import Refusal, Target, vet_address, vet_url

REDIRECTS = {301, 302, 303, 307, 308}
# Building an SSL context costs ~17 ms (the CA bundle is parsed): once per process, not per fetch.
_TLS = ssl.create_default_context()
MAGIC = [(b"\xff\xd8\xff", "jpeg"), (b"\x89PNG\r\n\x1a\n", "png"), (b"GIF87a", "gif"), (b"GIF89a", "gif"),
         (b"BM", "bmp")]



class FetchError(Exception):
    def __init__(self, error_class: str, reason: str) -> None:
        super().__init__(reason)
        self.error_class = error_class
        self.reason = reason


@dataclass(frozen=True)
class Fetched:
    data: bytes
    kind: str  # sniffed: jpeg | png | gif | webp | bmp
    final_url: str
    redirects: int
    fetch_ms: float


def sniff(data: bytes) -> str | None:
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return next((kind for magic, kind in MAGIC if data.startswith(magic)), None)


async def resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen: list[str] = []
    for *_, addr in infos:
        if addr[0] not in seen:
            seen.append(addr[0])
    return seen


async def _address_for(t: Target, rules: FetchRules) -> str:
    if t.ip_literal is not None:
        return str(t.ip_literal)
    try:
        addrs = await resolve(t.host, t.port)
    except socket.gaierror:
        raise FetchError("fetch_failed", f"{t.host} does not resolve") from None
    if not addrs:
        raise FetchError("fetch_failed", f"{t.host} does not resolve")
    for a in addrs:  # every answer must be acceptable: a mixed answer is a rebinding attempt
        refusal = vet_address(a, t, rules)
        if refusal is not None:
            raise FetchError(refusal.error_class, refusal.reason)
    return addrs[0]


def _raise(v: Target | Refusal) -> Target:
    if isinstance(v, Refusal):
        raise FetchError(v.error_class, v.reason)
    return v


async def fetch_image(url: str, rules: FetchRules, limits: FetchLimits, tenant: str | None = None) -> Fetched:
    t0 = time.perf_counter()
    try:
        async with asyncio.timeout(limits.total_timeout_s):
            return await _fetch(url, rules, limits, tenant, t0)
    except TimeoutError:
        raise FetchError("fetch_timeout", f"the fetch took over {limits.total_timeout_s:g}s") from None


async def _fetch(url: str, rules: FetchRules, limits: FetchLimits, tenant: str | None, t0: float) -> Fetched:
    timeout = httpx.Timeout(connect=limits.connect_timeout_s, read=limits.read_timeout_s,
                            write=limits.read_timeout_s, pool=limits.connect_timeout_s)
    current = url
    # a fresh client per fetch: nothing (cookies, connections) carries over from another tenant's fetch
    async with httpx.AsyncClient(trust_env=False, follow_redirects=False, timeout=timeout, verify=_TLS) as client:
        for hop in range(rules.max_redirects + 1):
            t = _raise(vet_url(current, rules, tenant))
            addr = await _address_for(t, rules)
            netloc = f"[{addr}]" if ":" in addr else addr
            default_port = 443 if t.scheme == "https" else 80
            host_header = t.host if t.port == default_port else f"{t.host}:{t.port}"
            headers = {"Host": host_header, "Accept-Encoding": "identity", "Accept": "image/*",
                       "User-Agent": "llmpipe-media/1"}
            extensions = {"sni_hostname": t.host} if t.scheme == "https" and t.ip_literal is None else {}
            req = client.build_request("GET", f"{t.scheme}://{netloc}:{t.port}{t.path}", headers=headers,
                                       extensions=extensions)
            try:
                resp = await client.send(req, stream=True)
            except httpx.TimeoutException:
                raise FetchError("fetch_timeout", f"{t.host} did not answer in time") from None
            except httpx.HTTPError as exc:
                raise FetchError("fetch_failed", f"{t.host}: {type(exc).__name__}") from None
            try:
                if resp.status_code in REDIRECTS:
                    location = resp.headers.get("location")
                    if not location:
                        raise FetchError("fetch_failed", f"redirect {resp.status_code} without a Location")
                    nxt = urljoin(current, location)
                    if t.scheme == "https" and nxt.lower().startswith("http:"):
                        raise FetchError("fetch_refused", "a redirect from https to plain http")
                    current = nxt
                    continue
                if resp.status_code != 200:
                    raise FetchError("fetch_failed", f"{t.host} answered HTTP {resp.status_code}")
                encoding = resp.headers.get("content-encoding", "identity").lower()
                if encoding not in ("identity", ""):
                    raise FetchError("unsupported_format", f"content-encoding {encoding!r} (only identity is read)")
                declared = resp.headers.get("content-length")
                if declared and declared.isdigit() and int(declared) > limits.max_bytes:
                    raise FetchError("too_large", f"{declared} bytes declared > {limits.max_bytes}")
                data = await _read_capped(resp, limits.max_bytes)
            except httpx.TimeoutException:
                raise FetchError("fetch_timeout", f"{t.host} stopped sending") from None
            except httpx.HTTPError as exc:
                raise FetchError("fetch_failed", f"{t.host}: {type(exc).__name__}") from None
            finally:
                await resp.aclose()
            kind = sniff(data)
            if kind is None:
                raise FetchError("unsupported_format", "not a JPEG, PNG, GIF, WebP or BMP image (by its bytes)")
            return Fetched(data, kind, current, hop, (time.perf_counter() - t0) * 1000)
    raise FetchError("fetch_refused", f"more than {rules.max_redirects} redirects")


async def _read_capped(resp: httpx.Response, max_bytes: int) -> bytes:
    buf = bytearray()
    async for chunk in resp.aiter_raw():
        buf += chunk
        if len(buf) > max_bytes:
            raise FetchError("too_large", f"body over {max_bytes} bytes")
    return bytes(buf)
