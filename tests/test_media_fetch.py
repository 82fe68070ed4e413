"""Fetching images against real local servers: hostile URLs and redirects are refused without any
connection to a refused address (the forbidden server's log stays empty), bodies are capped while
streaming, slow drips time out, bytes decide the type; and decoding refuses pixel bombs from the
header before any pixel is allocated."""

from __future__ import annotations

import socket
import time
from urllib.parse import quote

import psutil
import pytest
import pytest_asyncio

from pipeline.stages.media.config import FetchLimits, FetchRules, ProcessorConfig
from pipeline.stages.media.decode import DecodeError, decode
from pipeline.stages.media.fetch import FetchError, fetch_image
from tests.support.media_servers import HttpServer, ImageServer, jpeg

on_loop = pytest.mark.asyncio(loop_scope="session")

LIMITS = FetchLimits(max_bytes=2 << 20, connect_timeout_s=1, read_timeout_s=1, total_timeout_s=2)


@pytest_asyncio.fixture(loop_scope="session")
async def servers():
    good, forbidden = await ImageServer().start(), await HttpServer().start()
    try:
        yield good, forbidden
    finally:
        await good.stop()
        await forbidden.stop()


def rules_for(good: ImageServer) -> FetchRules:
    return FetchRules(test_allow=[f"127.0.0.1:{good.port}"])


@on_loop
async def test_an_allow_listed_image_is_fetched_and_typed_by_its_bytes(servers):
    good, _ = servers
    got = await fetch_image(f"{good.base}/ok.jpg", rules_for(good), LIMITS)
    assert got.kind == "jpeg" and got.data == good.images["/ok.jpg"] and got.redirects == 0
    got = await fetch_image(f"{good.base}/redirect?to=/ok.png", rules_for(good), LIMITS)
    assert got.kind == "png" and got.redirects == 1 and got.final_url.endswith("/ok.png")


@on_loop
async def test_hostile_fetches_are_refused_and_never_reach_a_refused_address(servers):
    good, forbidden = servers
    rules = rules_for(good)
    p = forbidden.port
    hostname = socket.gethostname()  # resolves to a loopback/private address on this machine
    direct = [
        f"http://127.0.0.1:{p}/x.jpg", f"http://localhost:{p}/x.jpg", f"http://{hostname}:{p}/x.jpg",
        f"http://2130706433:{p}/", f"http://0x7f.1:{p}/", f"http://0177.0.0.1:{p}/", f"http://127.1:{p}/",
        f"http://[::ffff:127.0.0.1]:{p}/", f"http://[::1]:{p}/", f"http://[::ffff:7f00:1]:{p}/",
        f"http://user:pw@127.0.0.1:{good.port}/ok.jpg",
    ]
    redirected = [f"http://127.0.0.1:{p}/x.jpg", f"http://localhost:{p}/", f"http://{hostname}:{p}/",
                  "http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/", f"http://[::ffff:127.0.0.1]:{p}/",
                  "file:///etc/passwd", f"gopher://127.0.0.1:{p}/", f"http://0x7f000001:{p}/"]
    cases = [(u, "fetch_refused") for u in direct]
    cases += [(f"{good.base}/redirect?to={quote(u, safe='')}", "fetch_refused") for u in redirected]
    cases += [
        (f"{good.base}/loop", "fetch_refused"),  # redirects to itself: over the hop limit
        (f"{good.base}/big", "too_large"),
        (f"{good.base}/stream", "too_large"),
        (f"{good.base}/drip", "fetch_timeout"),
        (f"{good.base}/page.html", "unsupported_format"),
        (f"{good.base}/gzip", "unsupported_format"),
        (f"{good.base}/missing", "fetch_failed"),
    ]
    assert len(cases) >= 25
    results = {}
    for url, want in cases:
        t0 = time.perf_counter()
        try:
            got = await fetch_image(url, rules, LIMITS)
            raise AssertionError(f"{url} was fetched ({got.kind}, {len(got.data)} bytes)")
        except FetchError as err:
            results[url] = (err.error_class, err.reason, time.perf_counter() - t0)
            assert err.error_class == want, (url, err.reason)
    assert forbidden.connections == [], "a refused address was connected to"
    assert not any("user" in c or "ok.jpg" in c for c in good.connections if "redirect" not in c), \
        "the URL with credentials was refused before connecting"
    assert results[f"{good.base}/drip"][2] < LIMITS.total_timeout_s + 1, "a slow drip is cut at the total deadline"
    print(f"\n{len(cases)} hostile fetches refused; forbidden server connections: {len(forbidden.connections)}")


def test_a_pixel_bomb_is_refused_from_its_header_fast_and_small():
    from tests.support.media_servers import claims_size

    bomb = claims_size(jpeg(400, 400, noise=True, quality=95), 30000, 30000)
    assert 150_000 < len(bomb) < 260_000, len(bomb)  # ~192 KB claiming 30000 x 30000
    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    t0 = time.perf_counter()
    with pytest.raises(DecodeError) as err:
        decode(bomb, "jpeg", ProcessorConfig())
    ms = (time.perf_counter() - t0) * 1000
    grew_mb = (proc.memory_info().rss - rss0) / 2**20
    assert err.value.error_class == "too_many_pixels" and "30000x30000" in err.value.reason
    print(f"\npixel bomb ({len(bomb) // 1024} KB, claims 30000x30000): refused in {ms:.1f} ms, RSS +{grew_mb:.1f} MB")
    assert ms < 100 and grew_mb < 50


def test_decode_resizes_normalises_and_scales_large_jpegs_down_in_libjpeg():
    d = decode(jpeg(1600, 1200), "jpeg", ProcessorConfig())
    assert d.tensor.shape == (3, 224, 224) and d.tensor.dtype.name == "float32"
    assert (d.width, d.height) == (1600, 1200) and d.reduced == 4
    small = decode(jpeg(64, 48), "jpeg", ProcessorConfig())
    assert small.reduced == 1 and small.tensor.shape == (3, 224, 224)
    with pytest.raises(DecodeError) as err:
        decode(b"\xff\xd8\xff" + b"\0" * 100, "jpeg", ProcessorConfig())
    assert err.value.error_class == "decode_error"
