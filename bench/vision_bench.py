"""Image path benchmark: where an image request's time goes before the first token.

    .venv/bin/python bench/vision_bench.py            # 64 images of 640x427
    .venv/bin/python bench/vision_bench.py --quick    # 16 images

For N distinct 640x427 JPEGs served by a local allow-listed server: fetch (SSRF-guarded, over
loopback), decode (header check, reduced decode, resize, normalise) and encode (MobileNetV2 on
onnxruntime, one thread) are timed separately; encode runs at batch 1 and at batch 16 over the
same tensors, side by side. Prints images/s for decode+encode at batch 1 vs 16, their ratio, and
the share of time per sub-step; then one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench._common import pct  # noqa: E402
from pipeline.engines.mobilenet import MobileNetEncoder  # noqa: E402
from pipeline.stages.media.config import FetchLimits, ProcessorConfig  # noqa: E402
from pipeline.stages.media.decode import decode  # noqa: E402
from pipeline.stages.media.fetch import fetch_image  # noqa: E402
from pipeline.stages.media.guard import FetchRules  # noqa: E402
from tests.support.media_servers import ImageServer, jpeg  # noqa: E402

console = Console()


def photo(i: int) -> bytes:
    """A 640x427 JPEG with structure (gradients + shapes), distinct per i."""
    import cv2

    img = np.dstack([np.linspace(0, 255, 640, dtype=np.uint8)[None, :].repeat(427, 0)] * 3)
    rng = np.random.default_rng(i)
    for _ in range(12):
        cv2.circle(img, (int(rng.integers(0, 640)), int(rng.integers(0, 427))), int(rng.integers(10, 120)),
                   tuple(int(c) for c in rng.integers(0, 256, 3)), -1)
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    return buf.tobytes()


async def run(n: int, threads: int = 1) -> dict[str, Any]:
    server = await ImageServer().start()
    try:
        for i in range(n):
            server.images[f"/photo/{i}.jpg"] = photo(i)
        rules = FetchRules(test_allow=[f"127.0.0.1:{server.port}"])
        limits = FetchLimits()
        cfg = ProcessorConfig()
        with tempfile.TemporaryDirectory() as d:
            enc = await asyncio.to_thread(MobileNetEncoder, Path(d), 3, threads)
            await asyncio.to_thread(enc.encode, decode(jpeg(), "jpeg", cfg).tensor[None])  # warm-up
            fetch_ms, decode_ms, tensors = [], [], []
            for i in range(n):
                t0 = time.perf_counter()
                got = await fetch_image(f"{server.base}/photo/{i}.jpg", rules, limits)
                fetch_ms.append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                tensors.append(decode(got.data, got.kind, cfg).tensor)
                decode_ms.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            for x in tensors:
                enc.encode(x[None])
            enc1_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            for k in range(0, n, 16):
                enc.encode(np.stack(tensors[k:k + 16]))
            enc16_s = time.perf_counter() - t0
            revision = enc.revision
    finally:
        await server.stop()
    dec_s = sum(decode_ms) / 1000
    fet_s = sum(fetch_ms) / 1000
    per_s_1 = n / (dec_s + enc1_s)
    per_s_16 = n / (dec_s + enc16_s)
    total16 = fet_s + dec_s + enc16_s
    return {"bench": "vision", "images": n, "size": "640x427", "encoder": revision, "cpus": os.cpu_count(),
            "threads": threads,
            "decode_encode_per_s_batch1": round(per_s_1, 1), "decode_encode_per_s_batch16": round(per_s_16, 1),
            "ratio_16_to_1": round(per_s_16 / per_s_1, 2),
            "fetch_ms_p50": pct(fetch_ms, 50), "decode_ms_p50": pct(decode_ms, 50),
            "encode_ms_per_image_batch1": round(enc1_s * 1000 / n, 2),
            "encode_ms_per_image_batch16": round(enc16_s * 1000 / n, 2),
            "share_fetch": round(fet_s / total16, 2), "share_decode": round(dec_s / total16, 2),
            "share_encode": round(enc16_s / total16, 2)}


app = typer.Typer(add_completion=False)


@app.command()
def main(quick: bool = typer.Option(False, "--quick"), images: int = typer.Option(None),
         threads: int = typer.Option(1, help="onnxruntime intra-op threads (the stage's default is 1)")) -> None:
    """Images/s of decode+encode at batch 1 vs 16, and where the time goes."""
    n = images or (16 if quick else 64)
    r = asyncio.run(run(n, threads))
    t = Table(title=f"Image path, {n} distinct 640x427 JPEGs over loopback, encoder {r['encoder']}, "
                    f"{threads} thread(s)")
    for col in ("decode+encode/s b1", "b16", "b16/b1", "fetch p50 ms", "decode p50 ms", "encode ms/img b1", "b16",
                "share fetch/decode/encode"):
        t.add_column(col, justify="right")
    t.add_row(f"{r['decode_encode_per_s_batch1']:.1f}", f"{r['decode_encode_per_s_batch16']:.1f}",
              f"{r['ratio_16_to_1']:.2f}", f"{r['fetch_ms_p50']:.1f}", f"{r['decode_ms_p50']:.1f}",
              f"{r['encode_ms_per_image_batch1']:.1f}", f"{r['encode_ms_per_image_batch16']:.1f}",
              f"{r['share_fetch']:.2f} / {r['share_decode']:.2f} / {r['share_encode']:.2f}")
    console.print(t)
    print(json.dumps(r, separators=(",", ":")))


if __name__ == "__main__":
    app()
