"""The clock that grace windows and deadlines read: the real one, or one a test moves by hand.

Code that waits for time to pass (a round's grace window, the synchronous baseline's deadline) takes
a `Clock` instead of calling `time.monotonic()` and `asyncio.sleep()` itself, so its logic is tested
without sleeping: the test hands it a `ManualClock` and calls `advance()`.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale (only differences mean anything)."""

    async def sleep(self, seconds: float) -> None:
        """Return once `seconds` have passed on this clock."""


class MonotonicClock:
    """Real time: `time.monotonic()` and `asyncio.sleep()`."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


MONOTONIC = MonotonicClock()


class ManualClock:
    """Time that moves only when `advance()` is awaited; sleepers wake in deadline order, each seeing
    `now()` equal to its own deadline. Use it on one event loop."""

    def __init__(self, start: float = 0.0):
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        wake = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + max(0.0, seconds), next(self._order), wake))
        await wake

    async def advance(self, seconds: float) -> None:
        """Move time forward by `seconds`, waking each sleeper due by then and letting it run (it may sleep
        again, within the same advance)."""
        until = self._now + seconds
        await _settle()
        while self._sleepers and self._sleepers[0][0] <= until:
            deadline, _, wake = heapq.heappop(self._sleepers)
            self._now = max(self._now, deadline)
            if not wake.done():
                wake.set_result(None)
            await _settle()
        self._now = until
        await _settle()


async def _settle(turns: int = 20) -> None:
    """Let the tasks woken so far run until they block again (a few loop turns)."""
    for _ in range(turns):
        await asyncio.sleep(0)
