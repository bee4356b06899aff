"""A response stream fed by a reader task (a bidirectional stream whose answers come as the
work they answer completes, not one per request in turn)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["answered"]

_T = TypeVar("_T")


async def answered(
    read: Callable[[asyncio.Queue[_T | None]], Coroutine[Any, Any, None]],
) -> AsyncIterator[_T]:
    """Run ``read(queue)`` as a task and yield what it puts on the queue until it puts None;
    the task is cancelled when the stream ends (the client went away)."""
    queue: asyncio.Queue[_T | None] = asyncio.Queue()
    reader = asyncio.get_running_loop().create_task(read(queue))
    try:
        while (item := await queue.get()) is not None:
            yield item
    finally:
        reader.cancel()
