"""The lifecycle every long-lived part of a stack follows, as aiokafka's clients do: no I/O in the
constructor, `await start()` returns the started part, `stop()` is idempotent and safe after a start
that failed half way. `run_stack` composes its parts with `serve()` on one AsyncExitStack, so they
stop in reverse order of start, also when a later part fails to start."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable
from contextlib import AsyncExitStack
from typing import Any, Protocol, TypeVar, runtime_checkable


@runtime_checkable
class Service(Protocol):
    async def start(self) -> Any: ...

    def stop(self) -> Awaitable[None] | None: ...  # a coroutine, or plain (a subprocess's)


S = TypeVar("S", bound=Service)


async def serve(stack: AsyncExitStack, part: S) -> S:
    """1. register `part.stop` on `stack` (a start that fails half way is still stopped);
    2. start `part` and return it."""

    async def stop() -> None:
        done = part.stop()
        if inspect.isawaitable(done):
            await done

    stack.push_async_callback(stop)
    await part.start()
    return part
