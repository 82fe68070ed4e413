"""Secure defaults as settings: what a fresh config means, and what weakens it is said aloud."""

from __future__ import annotations

import ssl

import pytest
from pydantic import ValidationError

from pipeline.config.settings import KafkaSecurity, Settings, kafka_kwargs
from pipeline.ingress.http import config_warnings


def test_a_fresh_config_requires_keys_and_meters_everyone():
    s = Settings()
    assert s.auth.required is True and s.auth.dev_tenant == "dev"
    d = s.tenant_defaults
    assert None not in (d.rpm, d.tpm, d.concurrency, d.daily_budget_usd)
    assert config_warnings(s) == []


def test_weakened_settings_are_reported():
    s = Settings(auth={"required": False},
                 stages=[{"name": "media", "policy": {"rules": {"test_allow": ["127.0.0.1:8000"]}}}])
    warnings = config_warnings(s)
    assert any("auth.required is false" in w for w in warnings)
    assert any("test_allow" in w and "1 endpoint" in w for w in warnings)


def test_kafka_security_settings_reach_the_clients():
    assert kafka_kwargs(KafkaSecurity()) == {} and kafka_kwargs(None) == {}
    with pytest.raises(ValidationError, match="SASL needs"):
        KafkaSecurity(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", sasl_username="svc")
    sec = KafkaSecurity(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", sasl_username="svc",
                        sasl_password="s3cret")
    kw = sec.client_kwargs()
    assert kw["security_protocol"] == "SASL_SSL" and kw["sasl_mechanism"] == "SCRAM-SHA-512"
    assert kw["sasl_plain_username"] == "svc" and kw["sasl_plain_password"] == "s3cret"
    assert isinstance(kw["ssl_context"], ssl.SSLContext) and kw["ssl_context"].verify_mode == ssl.CERT_REQUIRED
    assert "s3cret" not in repr(sec) and "s3cret" not in sec.model_dump_json()
    # an aiokafka client accepts exactly these options (no connection is made before start())
    import asyncio

    from aiokafka import AIOKafkaProducer

    async def construct() -> None:
        AIOKafkaProducer(bootstrap_servers="127.0.0.1:1", **kw)

    asyncio.run(construct())


def test_server_credentials_stay_out_of_the_dsn(monkeypatch):
    s = Settings(warehouse_dsn="http://clickhouse:8123/llmpipe", warehouse_user="llmpipe",
                 warehouse_password="pw-123")
    seen = {}
    import pipeline.stores.warehouse as wh

    monkeypatch.setattr(wh.clickhouse_connect, "get_client", lambda **kw: seen.update(kw) or object())
    w = wh.open_warehouse(s)
    assert seen == {"dsn": "http://clickhouse:8123/llmpipe", "username": "llmpipe", "password": "pw-123"}
    assert "pw-123" not in w.dsn and "pw-123" not in s.resolved_warehouse_dsn()


def test_no_config_means_the_whole_product_on_the_local_model():
    """`llmpipe up` with no config file (what a newcomer runs; the product path test now runs on the
    shared stack's config): every product stage, in order, and every default route served by a
    deployment that exists."""
    from pipeline.app.assemble import topology_for
    from pipeline.stages.catalog import PRODUCT_STAGES
    from pipeline.stages.route.config import RoutePolicy

    s = Settings()
    assert topology_for(s).order == ["mask", "cache", "route", "admit", "media", "vision", "generate", "postprocess"]
    assert list(PRODUCT_STAGES) == topology_for(s).order
    names = {d.name for d in s.deployments}
    routes = RoutePolicy().routes
    assert routes and all(r.deployments and set(r.deployments) <= names for r in routes.values()), (names, routes)
