"""Local HTTP servers for media tests: an image server (allow-listed by the test rules) and a
`forbidden` one that no fetch may ever reach. Both log every connection, so tests can prove that
no connection reached a refused address."""

from __future__ import annotations

import asyncio
from urllib.parse import parse_qs, urlsplit

import cv2
import numpy as np


def jpeg(width: int = 64, height: int = 48, noise: bool = False, quality: int = 90) -> bytes:
    rng = np.random.default_rng(7)
    img = (rng.integers(0, 256, (height, width, 3), dtype=np.uint8) if noise else
           np.dstack([np.linspace(0, 255, width, dtype=np.uint8)[None, :].repeat(height, 0)] * 3))
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    return buf.tobytes()


def png(width: int = 32, height: int = 32) -> bytes:
    ok, buf = cv2.imencode(".png", np.full((height, width, 3), 200, np.uint8))
    assert ok
    return buf.tobytes()


def claims_size(data: bytes, width: int, height: int) -> bytes:
    """A JPEG whose SOF header claims another size (the decompression-bomb shape)."""
    b = bytearray(data)
    i = 2
    while i < len(b):
        marker, length = b[i + 1], int.from_bytes(b[i + 2:i + 4], "big")
        if marker in (0xC0, 0xC1, 0xC2):
            b[i + 5:i + 7] = height.to_bytes(2, "big")
            b[i + 7:i + 9] = width.to_bytes(2, "big")
            return bytes(b)
        i += 2 + length
    raise ValueError("no SOF marker")


class HttpServer:
    """A tiny HTTP/1.1 server on 127.0.0.1: `routes` maps a path to a handler(writer, query)."""

    def __init__(self) -> None:
        self.connections: list[str] = []  # request lines received, in order
        self.server: asyncio.AbstractServer | None = None
        self.port = 0

    async def start(self) -> HttpServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = (await reader.readline()).decode("latin-1").strip()
            self.connections.append(line or "(no request line)")
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass
            parts = line.split(" ")
            url = urlsplit(parts[1] if len(parts) > 1 else "/")
            await self.handle(writer, url.path, parse_qs(url.query))
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def handle(self, writer: asyncio.StreamWriter, path: str, query: dict[str, list[str]]) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nno")
        await writer.drain()


def _response(status: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    head = {"Content-Length": str(len(body)), "Connection": "close", **(headers or {})}
    return (f"HTTP/1.1 {status}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in head.items()) + "\r\n").encode() + body


class ImageServer(HttpServer):
    """/ok.jpg /ok.png /bomb.jpg /page.html (says image/jpeg) /big (declares 64 MB) /stream (no
    length, endless) /drip (a byte every 300 ms) /gzip /redirect?to=URL /loop (to itself) /missing"""

    def __init__(self) -> None:
        super().__init__()
        self.images = {"/ok.jpg": jpeg(), "/ok.png": png(), "/bomb.jpg": claims_size(jpeg(400, 400, noise=True, quality=95),
                                                                                       30000, 30000)}

    async def handle(self, writer: asyncio.StreamWriter, path: str, query: dict[str, list[str]]) -> None:
        if path in self.images:
            writer.write(_response("200 OK", self.images[path], {"Content-Type": "text/plain"}))  # type lies; bytes decide
        elif path.startswith("/img/"):  # /img/<n>.jpg: distinct images for load tests
            n = int(path.split("/")[-1].split(".")[0])
            writer.write(_response("200 OK", jpeg(64 + n % 7, 48 + n % 5)))
        elif path == "/page.html":
            writer.write(_response("200 OK", b"<html><body>not an image</body></html>", {"Content-Type": "image/jpeg"}))
        elif path == "/big":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 67108864\r\nConnection: close\r\n\r\n"
                         + b"\xff\xd8\xff" + b"\0" * 65536)
        elif path == "/stream":
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n\xff\xd8\xff")
            for _ in range(2000):
                writer.write(b"\0" * 65536)
                await writer.drain()
        elif path == "/drip":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nConnection: close\r\n\r\n\xff\xd8\xff")
            for _ in range(1000):
                await writer.drain()
                await asyncio.sleep(0.3)
                writer.write(b"\0")
        elif path == "/gzip":
            writer.write(_response("200 OK", b"\x1f\x8b\x08\x00", {"Content-Encoding": "gzip"}))
        elif path == "/loop":
            writer.write(_response("302 Found", b"", {"Location": "/loop"}))
        elif path == "/redirect":
            writer.write(_response("302 Found", b"", {"Location": query.get("to", ["/ok.jpg"])[0]}))
        else:
            writer.write(_response("404 Not Found", b"missing"))
        await writer.drain()
