"""Timers inside a node process, for benchmarks/overhead.py's profile (not imported by pathswarm).

overhead.py copies this file as `sitecustomize.py` into a folder it puts first on the nodes' PYTHONPATH, and sets
PATHSWARM_PROBE=1. Python imports it at start-up; in a `pathswarm node run` process it wraps the functions a round
runs (inner steps, encode, decode, outer apply, the reducer's close, digests, checkpoint and partial-round saves, ...)
with timers that add wall and thread-CPU seconds per function and per thread (the training thread is the main
thread; every other thread is "bg"), and writes them next to the node's status file (STATUS.probe.json) at exit.
A wrapper costs two clock reads per call; nothing else in the node changes. Any other process ignores it.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import threading
import time

_stats: dict[str, list[float]] = {}  # "name@thread" → [calls, wall s, thread cpu s]
_events: list[tuple[str, float]] = []  # (what, time.time()) of the training loop's start, sends, rounds, end
_lock = threading.Lock()
_training = threading.Event()  # future waits count only inside the training loop
EVENTS = {"train_loop", "send_round", "round_complete"}


def _timed(name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        main = threading.current_thread() is threading.main_thread()
        if name in EVENTS and main:
            _events.append((name + ".start", time.time()))
        if name == "train_loop":
            _training.set()
        w0, c0 = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
            if name == "train_loop":
                _training.clear()
            if name in EVENTS and main:
                _events.append((name + ".end", time.time()))
            where = "main" if main else "bg"
            with _lock:
                s = _stats.setdefault(f"{name}@{where}", [0, 0.0, 0.0])
                s[0] += 1
                s[1] += wall
                s[2] += cpu

    return wrapper


TARGETS = [  # (module, attribute, timer): what a round runs, by the file that calls it (skipped when absent)
    ("pathswarm.node.train.worker", "PathWorker.train_inner", "inner_steps"),
    ("pathswarm.node.train.worker", "PathWorker.flat", "flat"),
    ("pathswarm.node.train.worker", "PathWorker.set_flat", "set_flat"),
    ("pathswarm.node.train.worker", "PathWorker.module_state", "module_state"),
    ("pathswarm.protocol.rounds.outer", "OuterState.stepped", "outer_apply"),
    ("pathswarm.protocol.rounds.outer", "state_digest", "digest"),
    ("pathswarm.node.train.checkpoint", "state_digest", "digest"),
    ("pathswarm.node.peer.state_sync", "state_digest", "digest"),
    ("pathswarm.node.peer.rounds", "make_contribution", "encode"),
    ("pathswarm.node.peer.rounds", "settle", "settle_apply"),
    ("pathswarm.protocol.rounds.exchange", "rule_closer", "reduce_close"),
    ("pathswarm.protocol.rounds.rule", "decode_mean", "decode_mean"),
    ("pathswarm.protocol.rounds.merge", "merge", "merge"),
    ("pathswarm.protocol.rounds.rule", "encode_mean", "encode_mean"),
    ("pathswarm.compression.feedback", "encode_values", "encode_values"),
    ("pathswarm.node.peer.checkpoints", "save_checkpoint", "checkpoint_save"),
    ("pathswarm.node.peer.resume", "save_partial", "partial_save"),
    ("pathswarm.node.peer.resume", "discard_partial", "partial_discard"),
    ("pathswarm.node.peer.round_loop", "RoundLoop.run", "train_loop"),
    ("pathswarm.node.peer.round_loop", "RoundLoop._round_complete", "round_complete"),
    ("pathswarm.node.peer.round_loop", "RoundLoop._poll", "poll"),
    ("pathswarm.node.peer.node", "Node._write_status", "status_write"),
    ("pathswarm.node.peer.rounds", "Rounds.send", "send_round"),
    ("pathswarm.node.peer.rounds", "Rounds._settle", "settle_one"),
    ("pathswarm.node.peer.state_sync", "StateSync.publish_local", "publish_local"),
    ("pathswarm.node.peer.announce", "Announcer.announce", "announce"),
    ("pathswarm.node.peer.announce", "Announcer._publish", "dht_publish"),
    ("pathswarm.node.peer.claims", "Claims.publish", "dht_claim"),
    ("pathswarm.node.peer.claims", "Claims.refresh", "dht_read_claims"),
]


def _future_wait(fn):
    """concurrent.futures.Future.result on the training thread inside the training loop: time spent waiting for
    the network (rounds in flight); elsewhere the plain method."""

    @functools.wraps(fn)
    def result(self, timeout=None):
        if not (_training.is_set() and threading.current_thread() is threading.main_thread()) or self.done():
            return fn(self, timeout)
        return _timed("future_wait", fn)(self, timeout)

    return result


def _install(out: str) -> None:
    import concurrent.futures
    import importlib

    missing = []
    for module, attr, name in TARGETS:
        try:
            obj = importlib.import_module(module)
            *owners, last = attr.split(".")
            for o in owners:
                obj = getattr(obj, o)
            setattr(obj, last, _timed(name, getattr(obj, last)))
        except (ImportError, AttributeError):
            missing.append(f"{module}.{attr}")
    concurrent.futures.Future.result = _future_wait(concurrent.futures.Future.result)

    def dump() -> None:
        with _lock:
            stats = {k: {"calls": int(v[0]), "wall_s": round(v[1], 3), "cpu_s": round(v[2], 3)}
                     for k, v in sorted(_stats.items())}
        tmp = out + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"pid": os.getpid(), "timers": stats, "events": _events, "not_found": missing}, f, indent=1)
        os.replace(tmp, out)

    atexit.register(dump)


def _main() -> None:
    argv = sys.argv
    if os.environ.get("PATHSWARM_PROBE") != "1" or "node" not in argv or "--status-file" not in argv:
        return
    out = argv[argv.index("--status-file") + 1] + ".probe.json"
    try:
        _install(out)
    except Exception as e:  # a probe must never stop a node
        print(f"overhead probe not installed: {e!r}", file=sys.stderr)


_main()
