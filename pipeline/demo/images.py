"""The demo's local image server: a few honest images and the hostile ones media must refuse (a
redirect to an internal address, a decompression bomb, HTML posing as an image). Images are drawn
at start, so nothing is downloaded or shipped as binary."""

from __future__ import annotations

import io
import struct
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from PIL import Image


def _encode(img: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt)
    return buf.getvalue()


def _bomb_png(width: int = 30_000, height: int = 30_000) -> bytes:
    """A valid PNG header claiming width×height pixels, with a tiny body: decoding it would need
    GBs; media reads the header and refuses it."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 1024)) + \
        chunk(b"IEND", b"")


def demo_images() -> dict[str, tuple[str, bytes]]:
    y, x = np.mgrid[0:240, 0:320]
    gradient = np.stack([x * 255 // 319, y * 255 // 239, np.full_like(x, 128)], axis=-1).astype(np.uint8)
    stripes = np.zeros((240, 320, 3), np.uint8)
    stripes[(x // 20) % 2 == 0] = (250, 250, 250)
    stripes[(x // 20) % 2 == 1] = (20, 20, 160)
    return {
        "/red.png": ("image/png", _encode(Image.new("RGB", (256, 192), (210, 30, 40)), "PNG")),
        "/gradient.png": ("image/png", _encode(Image.fromarray(gradient), "PNG")),
        "/stripes.jpg": ("image/jpeg", _encode(Image.fromarray(stripes), "JPEG")),
        "/bomb.png": ("image/png", _bomb_png()),
        "/not-an-image": ("image/png", b"<html><body>surprise</body></html>"),
    }


class DemoImageServer:
    """127.0.0.1 on a free port, in a daemon thread; `base_url` once started."""

    def __init__(self) -> None:
        images = demo_images()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's name
                if self.path == "/redirect-internal":  # media must not follow this into the private network
                    self.send_response(302)
                    self.send_header("Location", "http://10.0.0.1/admin.png")
                    self.end_headers()
                    return
                found = images.get(self.path)
                if found is None:
                    self.send_error(404)
                    return
                kind, body = found
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="demo-images", daemon=True)

    def start(self) -> DemoImageServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
