"""The node's DHT chores (announcing module states and metrics, renewing its claim), run off the training thread.

A hivemind store that meets a dead or frozen peer waits for that peer's RPC timeout: seconds, in a swarm
where nodes die all the time. Measured in the chaos benchmark before this thread existed, a node's training
loop spent ~4 % of its time on announcements alone. Training must not wait for advisory records, so the
training thread only hands them over. (Reading the claims stays on the training thread, bounded in time:
the reducer of a round must be picked from a view read when the round is sent, see RoundLoop.run.)

Jobs are named; a job handed over while an older one of the same name is still queued replaces it (the
newest announcement is the only one worth sending). One thread runs them in order of first submission.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)


class Chores:
    """One daemon thread that runs named, coalescing jobs; a failing job is logged, never raised."""

    def __init__(self, name: str = "pathswarm-dht"):
        self._jobs: dict[str, Callable[[], object]] = {}
        self._cv = threading.Condition()
        self._closed = False
        self._busy = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, name: str, job: Callable[[], object], first: bool = False) -> None:
        """Queue `job` under `name`, replacing a queued job of that name that has not started yet; `first` puts it
        ahead of the queued jobs (a claim renewal must not wait behind announcements that meet dead peers)."""
        with self._cv:
            if self._closed:
                return
            if first:
                self._jobs.pop(name, None)
                self._jobs = {name: job, **self._jobs}
            else:
                self._jobs[name] = job
            self._cv.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until no job is queued or running; True if that happened within timeout_s."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while self._jobs or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def close(self, timeout_s: float) -> bool:
        """Drop the jobs not started yet, let the running one finish (up to timeout_s); True if it did."""
        with self._cv:
            self._closed = True
            self._jobs.clear()
            self._cv.notify_all()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def finish(self, timeout_s: float) -> bool:
        """Let the queued jobs run (up to timeout_s), then close; False when one was still running (it is left behind:
        the thread is a daemon)."""
        if self.wait_idle(timeout_s) and self.close(timeout_s=1):
            return True
        self.close(timeout_s=0)
        return False

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._jobs and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                name = next(iter(self._jobs))
                job = self._jobs.pop(name)
                self._busy = True
            try:
                job()
            except Exception as e:  # advisory work: the next round tries again
                logger.warning("%s failed: %s", name, e)
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()
