"""Decoding an image without letting its header decide how much memory we spend.

The header's size is read first (PIL reads only the header: ~1 ms) and images over the pixel
budget are refused before OpenCV sees them (a 192 KB JPEG claiming 30000² decodes to
5 GB). `OPENCV_IO_MAX_IMAGE_PIXELS` is OpenCV's own cap, a second line: it is read when cv2 is
first imported, so it is set here before the import (worker processes import this module before
anything else imports cv2; `llmpipe worker` sets it too). Large JPEGs are decoded at 1/2, 1/4 or
1/8 scale by libjpeg itself when the processor's output size allows it.
"""

from __future__ import annotations

import io
import os
import time
from dataclasses import dataclass

import numpy as np

from pipeline.config.settings import MAX_IMAGE_PIXELS as DEFAULT_MAX_PIXELS

os.environ.setdefault("OPENCV_IO_MAX_IMAGE_PIXELS", str(DEFAULT_MAX_PIXELS))

import cv2

from pipeline.stages.media.config import ProcessorConfig


class DecodeError(Exception):
    def __init__(self, error_class: str, reason: str) -> None:
        super().__init__(reason)
        self.error_class = error_class
        self.reason = reason



@dataclass(frozen=True)
class Decoded:
    width: int  # as the header declared
    height: int
    tensor: np.ndarray  # float32, 3 x size x size, normalised
    reduced: int  # libjpeg scale-down used (1, 2, 4, 8)
    decode_ms: float


def header_size(data: bytes) -> tuple[int, int]:
    """(width, height) from the header alone."""
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = None  # our budget decides, below; PIL's check would raise its own error class
    try:
        with Image.open(io.BytesIO(data)) as im:
            return im.size
    except Exception as exc:  # noqa: BLE001 - any unreadable header is the caller's bad input
        raise DecodeError("decode_error", f"unreadable image header ({type(exc).__name__})") from None


def decode(data: bytes, kind: str, cfg: ProcessorConfig) -> Decoded:
    t0 = time.perf_counter()
    w, h = header_size(data)
    if w <= 0 or h <= 0:
        raise DecodeError("decode_error", f"image declares {w}x{h}")
    if w * h > cfg.max_pixels:
        raise DecodeError("too_many_pixels", f"{w}x{h} = {w * h:,} pixels > budget {cfg.max_pixels:,}")
    reduced = 1
    if kind == "jpeg":
        while reduced < 8 and min(w, h) // (reduced * 2) >= cfg.size:
            reduced *= 2
    flag = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
            8: cv2.IMREAD_REDUCED_COLOR_8}[reduced]
    img = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
    if img is None:
        raise DecodeError("decode_error", f"{kind} data does not decode")
    ih, iw = img.shape[:2]
    scale = cfg.size / min(ih, iw)
    img = cv2.resize(img, (max(cfg.size, round(iw * scale)), max(cfg.size, round(ih * scale))),
                     interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR)
    ih, iw = img.shape[:2]
    top, left = (ih - cfg.size) // 2, (iw - cfg.size) // 2
    img = img[top:top + cfg.size, left:left + cfg.size, ::-1]  # BGR -> RGB
    x = (img.astype(np.float32) / 255.0 - np.array(cfg.mean, np.float32)) / np.array(cfg.std, np.float32)
    return Decoded(w, h, np.ascontiguousarray(x.transpose(2, 0, 1)), reduced, (time.perf_counter() - t0) * 1000)
