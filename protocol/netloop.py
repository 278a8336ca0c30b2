"""A background thread running one asyncio event loop: the node's network side.

hivemind's P2P client and our stream handlers live on this loop, while the training loop runs on
the main thread and never blocks on the network: it submits coroutines and polls their futures
between inner steps (that is how averaging of round r overlaps training of round r+1).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

STOP_POLL_S = 0.1
"""How often a wait that can be stopped looks at its stop event: a Ctrl-C ends a download within this (plus the
cancellation), not when the download times out."""


class Interrupted(Exception):
    """A wait on the network loop was given up because the node is stopping (its coroutine is cancelled)."""


class NetLoop:
    def __init__(self, name: str = "pathswarm-net"):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None,
            stop: threading.Event | None = None, tick: Callable[[], None] | None = None) -> T:
        """The coroutine's result (concurrent.futures.TimeoutError after timeout_s). With `stop`: Interrupted as soon
        as it is set, the coroutine cancelled (a node asked to stop does not wait out a 20-s state download); `tick`:
        called about every STOP_POLL_S while it waits (progress of a long download)."""
        future = self.submit(coro)
        if stop is None and tick is None:
            return future.result(timeout_s)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if tick is not None:
                tick()
            if stop is not None and stop.is_set():
                future.cancel()
                raise Interrupted("stopping")
            step = STOP_POLL_S if deadline is None else min(STOP_POLL_S, max(0.0, deadline - time.monotonic()))
            try:
                return future.result(step)
            except concurrent.futures.TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    future.cancel()
                    raise

    def stop(self, timeout_s: float = 5.0) -> None:
        """Cancel every task still running on the loop (handlers, open rounds), then stop it."""
        if not self.loop.is_running():
            return

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            self.submit(cancel_all()).result(timeout_s)
        except (concurrent.futures.TimeoutError, RuntimeError):
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=timeout_s)
