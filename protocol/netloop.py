"""A background thread running one asyncio event loop: the node's network side.

hivemind's P2P client and our stream handlers live on this loop, while the training loop runs on
the main thread and never blocks on the network: it submits coroutines and polls their futures
between inner steps (that is how averaging of round r overlaps training of round r+1).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


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

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        return self.submit(coro).result(timeout_s)

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
