"""Waiting on conditions in process-level tests: never a bare sleep (DESIGN §5)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable


async def until(check: Callable[[], bool | Awaitable[bool]], what: str, timeout: float) -> float:
    """Poll ``check`` (plain or async) every 50 ms until it holds; returns the seconds it
    took, or fails the test naming ``what`` after ``timeout`` seconds."""
    started = time.monotonic()
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.05)
