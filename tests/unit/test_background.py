"""The chores thread: DHT work handed over by the training thread runs in order, coalesces, never raises."""

from __future__ import annotations

import logging
import threading
import time

from pathswarm.node.peer.background import Chores


def test_jobs_run_off_the_calling_thread_in_order_of_submission():
    chores, ran = Chores(), []
    try:
        for name in ("a", "b", "c"):
            chores.submit(name, lambda name=name: ran.append((name, threading.current_thread().name)))
        assert chores.wait_idle(5)
        assert ran == [("a", "pathswarm-dht"), ("b", "pathswarm-dht"), ("c", "pathswarm-dht")]
    finally:
        chores.close(1)


def test_a_newer_job_replaces_a_queued_one_of_the_same_name():
    chores, ran = Chores(), []
    gate = threading.Event()
    try:
        chores.submit("slow", gate.wait)  # holds the thread while we queue behind it
        for round_ in range(5):
            chores.submit("announce", lambda r=round_: ran.append(r))
        chores.submit("claims", lambda: ran.append("claims"))
        gate.set()
        assert chores.wait_idle(5)
        # only the newest announcement went out, ahead of the later-named job it was queued before
        assert ran == [4, "claims"]
    finally:
        chores.close(1)


def test_a_failing_job_is_logged_and_the_next_one_still_runs(caplog):
    chores, ran = Chores(), []

    def boom():
        raise RuntimeError("no peer answered")

    try:
        with caplog.at_level(logging.WARNING, logger="pathswarm.node.peer.background"):
            chores.submit("announce", boom)
            chores.submit("claims", lambda: ran.append(1))
            assert chores.wait_idle(5)
        assert ran == [1]
        assert any("announce failed: no peer answered" in r.getMessage() for r in caplog.records)
    finally:
        chores.close(1)


def test_close_drops_queued_jobs_and_waits_for_the_running_one():
    chores, ran = Chores(), []
    started, gate = threading.Event(), threading.Event()

    def running():
        started.set()
        gate.wait(5)
        ran.append("running")

    chores.submit("running", running)
    assert started.wait(5)
    chores.submit("queued", lambda: ran.append("queued"))
    assert not chores.close(timeout_s=0.2)  # still running: close says so instead of blocking
    gate.set()
    assert chores.close(timeout_s=5)
    assert ran == ["running"]
    chores.submit("after", lambda: ran.append("after"))  # ignored once closed
    time.sleep(0.1)
    assert ran == ["running"]


def test_wait_idle_times_out_while_a_job_runs():
    chores, gate = Chores(), threading.Event()
    try:
        chores.submit("stuck", lambda: gate.wait(5))
        t0 = time.monotonic()
        assert not chores.wait_idle(0.3)
        assert 0.25 <= time.monotonic() - t0 < 2
        gate.set()
        assert chores.wait_idle(5)
    finally:
        chores.close(1)
