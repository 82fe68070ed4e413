"""Which image URLs media may fetch, and which addresses it may connect to (SSRF guard).

Plain functions, no I/O: `vet_url` checks a URL's shape (scheme, userinfo, host spelling, port,
the tenant's domain allow-list) and `vet_address` one resolved address. The fetcher resolves a
host once, vets every address it got, and connects to a vetted address itself, so a second DNS
answer (rebinding) never decides where a connection goes. Every redirect hop is vetted again.

Refused: loopback, private, link-local (incl. 169.254.169.254), CGNAT, multicast, reserved,
unspecified, documentation and benchmark ranges (anything not globally routable), IPv6 forms that
embed such an IPv4 address (mapped, compatible, 6to4, NAT64, Teredo), site-local; and IPv4 written
in any non-canonical way (decimal, octal, hex, short forms), which resolvers accept and humans misread.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from pipeline.stages.media.config import FetchRules

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_NUMERIC_HOST = re.compile(r"^(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]*))*\.?$", re.IGNORECASE)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")



@dataclass(frozen=True)
class Refusal:
    error_class: str  # fetch_refused | unsupported_format
    reason: str


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # lower-case, IDNA, no trailing dot; an IP literal in canonical form
    port: int
    path: str  # path + query, at least "/"
    ip_literal: IPAddress | None


def _refuse(reason: str) -> Refusal:
    return Refusal("fetch_refused", reason)


def vet_url(url: str, rules: FetchRules, tenant: str | None = None) -> Target | Refusal:
    """Is this URL's shape acceptable? (Its addresses are vetted after resolution.)"""
    if any(c in url for c in "\r\n\t\\") or not url.isprintable():
        return _refuse("control characters or backslashes in the URL")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return _refuse("unparseable URL")
    scheme = parts.scheme.lower()
    if scheme not in rules.schemes:
        return Refusal("unsupported_format" if scheme == "data" else "fetch_refused",
                       f"scheme {scheme or '(none)'!r} not allowed")
    if "@" in parts.netloc or parts.username is not None or parts.password is not None:
        return _refuse("credentials in the URL")
    raw_host = (parts.hostname or "").rstrip(".")
    if not raw_host:
        return _refuse("no host")
    port = port if port is not None else (443 if scheme == "https" else 80)
    ip: IPAddress | None = None
    if parts.netloc.split(":")[0].startswith("[") or ":" in raw_host:
        try:
            ip = ipaddress.IPv6Address(raw_host.split("%")[0])
        except ValueError:
            return _refuse("malformed IPv6 literal")
        if "%" in raw_host:
            return _refuse("IPv6 zone identifiers are not allowed")
        host = str(ip)
    elif _NUMERIC_HOST.match(raw_host):
        try:
            ip = ipaddress.IPv4Address(raw_host)  # only the canonical dotted quad parses here
        except ValueError:
            return _refuse(f"non-canonical IPv4 literal {raw_host!r} (decimal, octal, hex or short form)")
        host = str(ip)
    else:
        try:
            host = raw_host.encode("idna").decode("ascii").lower()
        except UnicodeError:
            return _refuse("host is not a valid domain name")
        if not re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*", host):
            return _refuse("host is not a valid domain name")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    target = Target(scheme, host, port, path, ip)
    if f"{host}:{port}" in rules.test_allow:
        return target
    if port not in rules.ports:
        return _refuse(f"port {port} not allowed")
    if tenant is not None and tenant in rules.tenant_domains and ip is None:
        if not any(host == d.lstrip(".") or (d.startswith(".") and host.endswith(d)) for d in rules.tenant_domains[tenant]):
            return _refuse(f"host {host} is not on the tenant's allow-list")
    elif tenant is not None and tenant in rules.tenant_domains:
        return _refuse("IP literals are not on the tenant's allow-list")
    if ip is not None:
        why = why_not_public(ip)
        if why:
            return _refuse(f"address {ip} is {why}")
    return target


def why_not_public(ip: IPAddress) -> str | None:
    """None for a globally routable unicast address; else what it is."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if ip in _NAT64 or ip in _NAT64_LOCAL:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        elif embedded is None and int(ip) >> 32 == 0 and int(ip) > 1:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)  # IPv4-compatible ::a.b.c.d (deprecated)
        if ip.teredo:
            return "a Teredo tunnel address"
        if embedded is not None:
            inner = why_not_public(embedded)
            return f"an IPv6 form of {embedded} ({inner})" if inner else f"an IPv6 form of {embedded} (use the IPv4 address)"
        if ip.is_site_local:
            return "site-local"
    for name in ("loopback", "link_local", "multicast", "unspecified", "reserved", "private"):
        if getattr(ip, f"is_{name}"):
            return {"link_local": "link-local (incl. cloud metadata)"}.get(name, name)
    if not ip.is_global:
        return "not globally routable (e.g. CGNAT, documentation, benchmarking)"
    return None


def vet_address(ip_text: str, target: Target, rules: FetchRules) -> Refusal | None:
    """May media connect to this resolved address for `target`?"""
    try:
        ip = ipaddress.ip_address(ip_text.split("%")[0])
    except ValueError:
        return _refuse(f"resolver returned an unparseable address for {target.host}")
    if f"{ip}:{target.port}" in rules.test_allow or f"{target.host}:{target.port}" in rules.test_allow:
        return None
    why = why_not_public(ip)
    if why is None:
        return None
    # the caller learns the kind of address, never the address: a DNS oracle for private names otherwise
    kind = "an IPv6 form of a non-public IPv4 address" if why.startswith("an IPv6 form") else why
    return _refuse(f"{target.host} resolves to an address that is not public: {kind}")


def family_of(ip_text: str) -> int:
    return socket.AF_INET6 if ":" in ip_text else socket.AF_INET
