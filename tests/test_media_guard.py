"""The SSRF guard's URL and address rules, without any network."""

from __future__ import annotations

import pytest

from pipeline.stages.media.config import FetchRules
from pipeline.stages.media.guard import (
    Refusal,
    Target,
    vet_address,
    vet_url,
    why_not_public,
)

RULES = FetchRules()

HOSTILE = [
    # loopback, in every spelling
    ("http://127.0.0.1/a.jpg", "loopback"),
    ("http://127.1/a.jpg", "non-canonical IPv4"),
    ("http://2130706433/a.jpg", "non-canonical IPv4"),
    ("http://0x7f000001/a.jpg", "non-canonical IPv4"),
    ("http://0x7f.0.0.1/a.jpg", "non-canonical IPv4"),
    ("http://0177.0.0.1/a.jpg", "non-canonical IPv4"),
    ("http://017700000001/a.jpg", "non-canonical IPv4"),
    ("http://127.0.0.1./a.jpg", "loopback"),
    ("http://[::1]/a.jpg", "loopback"),
    ("http://[::ffff:127.0.0.1]/a.jpg", "IPv6 form of 127.0.0.1"),
    ("http://[::ffff:7f00:1]/a.jpg", "IPv6 form of 127.0.0.1"),
    ("http://[::127.0.0.1]/a.jpg", "IPv6 form of 127.0.0.1"),
    ("http://[2002:7f00:1::]/a.jpg", "IPv6 form of 127.0.0.1"),
    ("http://[64:ff9b::a9fe:a9fe]/a.jpg", "IPv6 form of 169.254.169.254"),
    ("http://[fe80::1%25eth0]/a.jpg", "zone"),
    # metadata, private, CGNAT, multicast, reserved, unspecified
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://[fe80::1]/a.jpg", "link-local"),
    ("http://10.0.0.1/a.jpg", "private"),
    ("http://172.16.5.4/a.jpg", "private"),
    ("http://192.168.1.1/a.jpg", "private"),
    ("http://[fc00::1]/a.jpg", "private"),
    ("http://[fec0::1]/a.jpg", "site-local"),
    ("http://100.64.0.1/a.jpg", "not globally routable"),
    ("http://224.0.0.1/a.jpg", "multicast"),
    ("http://240.0.0.1/a.jpg", "reserved"),
    ("http://0.0.0.0/a.jpg", "unspecified"),
    ("http://192.0.2.10/a.jpg", "private"),  # documentation range
    # shapes
    ("http://user:pw@example.com/a.jpg", "credentials"),
    ("http://example.com@127.0.0.1/a.jpg", "credentials"),
    ("file:///etc/passwd", "scheme"),
    ("gopher://example.com/", "scheme"),
    ("ftp://example.com/a.jpg", "scheme"),
    ("http://example.com:6379/a.jpg", "port 6379"),
    ("http://exa mple.com/a.jpg", "valid domain"),
    ("http://example.com\\@127.0.0.1/", "backslash"),
    ("http:///a.jpg", "no host"),
]


@pytest.mark.parametrize("url,why", HOSTILE)
def test_hostile_urls_are_refused_with_the_reason(url, why):
    v = vet_url(url, RULES)
    assert isinstance(v, Refusal) and v.error_class == "fetch_refused", (url, v)
    assert why in v.reason, (url, v.reason)


def test_there_are_at_least_25_hostile_cases():
    assert len(HOSTILE) >= 25


def test_public_urls_pass_and_are_normalised():
    v = vet_url("https://Images.Example.COM./cat.jpg?size=2", RULES)
    assert isinstance(v, Target) and (v.host, v.port, v.path) == ("images.example.com", 443, "/cat.jpg?size=2")
    v = vet_url("http://93.184.215.14/x.png", RULES)
    assert isinstance(v, Target) and v.ip_literal is not None
    assert isinstance(vet_url("https://bücher.example/x.jpg", RULES), Target)  # IDNA


def test_data_urls_are_not_fetched():
    v = vet_url("data:image/png;base64,AAAA", RULES)
    assert isinstance(v, Refusal) and v.error_class == "unsupported_format"


def test_tenant_allow_list():
    rules = FetchRules(tenant_domains={"acme": ["cdn.acme.com", ".img.acme.com"]})
    assert isinstance(vet_url("https://cdn.acme.com/a.jpg", rules, "acme"), Target)
    assert isinstance(vet_url("https://eu.img.acme.com/a.jpg", rules, "acme"), Target)
    assert isinstance(vet_url("https://img.acme.com/a.jpg", rules, "acme"), Target)
    assert "allow-list" in vet_url("https://evil.com/a.jpg", rules, "acme").reason
    assert "allow-list" in vet_url("https://cdn.acme.com.evil.com/a.jpg", rules, "acme").reason
    assert "allow-list" in vet_url("https://93.184.215.14/a.jpg", rules, "acme").reason
    assert isinstance(vet_url("https://evil.com/a.jpg", rules, "other"), Target), "tenants without a list: any public host"


def test_resolved_addresses_are_vetted():
    t = vet_url("http://internal.example.com/a.jpg", RULES)
    assert isinstance(t, Target)
    refusal = vet_address("10.1.2.3", t, RULES).reason
    assert refusal == "internal.example.com resolves to an address that is not public: private"
    assert "10.1.2.3" not in refusal  # no DNS oracle: the caller never learns the private address
    assert "::ffff" not in vet_address("::ffff:10.1.2.3", t, RULES).reason
    assert "10.1.2.3" not in vet_address("::ffff:10.1.2.3", t, RULES).reason
    assert vet_address("::ffff:10.1.2.3", t, RULES) is not None
    assert vet_address("93.184.215.14", t, RULES) is None


def test_the_test_allow_list_names_one_endpoint_only():
    rules = FetchRules(test_allow=["127.0.0.1:8123"])
    assert isinstance(vet_url("http://127.0.0.1:8123/a.jpg", rules), Target)
    assert isinstance(vet_url("http://127.0.0.1:8124/a.jpg", rules), Refusal)
    assert FetchRules().test_allow == [], "production default allows nothing local"


def test_why_not_public_covers_teredo_and_nat64():
    import ipaddress

    assert "Teredo" in why_not_public(ipaddress.ip_address("2001:0:4136:e378:8000:63bf:3fff:fdd2"))
    assert why_not_public(ipaddress.ip_address("8.8.8.8")) is None
    assert why_not_public(ipaddress.ip_address("2606:4700:4700::1111")) is None
