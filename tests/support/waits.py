"""Waits that end on a condition and fail with what they saw last, never a fixed sleep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def wait_until(cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll a condition (sync or async) until truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = cond()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def poll(read: Callable[[], T], done: Callable[[T], Any], timeout: float, what: str, interval: float = 0.5) -> T:
    """Call `read()` until `done(value)` holds; return that value. Fails after `timeout` seconds
    with `what` and the last value read (a wait that falls through would test a partial state)."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if done(value):
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {value!r})")
        time.sleep(interval)
