"""The lifecycle every long-lived part of a stack follows, as aiokafka's clients do: no I/O in the
constructor, `await start()` returns the started part, `stop()` is idempotent and safe after a start
that failed half way. `run_stack` composes its parts with `serve()` on one AsyncExitStack, so they
stop in reverse order of start, also when a later part fails to start."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Coroutine
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


class BackgroundTask:
    """The one asyncio task a part runs while it is started (a watch, a keeper, a follower's loop).
    `launch()` starts it unless it runs already; `cancel()` cancels it and waits until it has ended;
    both are idempotent, so a part's `stop()` is safe after a start that failed half way."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._task: asyncio.Task[Any] | None = None

    def launch(self, loop: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        if self._task is None:
            self._task = asyncio.create_task(loop(), name=self.name)

    async def cancel(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
