"""The edges of a node's run: the device it trains on, its pace, Ctrl-C and SIGTERM, how long it lingers when its
run ends, and the last line it logs. Node.run (node/peer/node.py) calls these; they hold no state of their own.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import threading
import time

import torch

from pathswarm.node.model.data import TokenSampler
from pathswarm.node.model.router import documents_of_path

logger = logging.getLogger(__name__)


def linger_s(since_last_close_s: float | None, grace_s: float) -> float:
    """How long a node that ends its run (not by a signal) keeps serving after the last round it reduced: members
    check a reducer's first rounds of each module before applying them (node/peer/audit.py), downloading its frames
    right after the reply; a reducer gone by then fails the round for them, and they reduce it again alone: a split
    with the departed node (tests/swarm/test_hostile.py saw one). Counted from now when we closed a round in the last
    two grace windows: a round in slices (protocol/rounds/slices.py) ends for us when the last of its slices does, a
    grace window after we closed ours at most, and its members check the slices one after another."""
    if since_last_close_s is None or since_last_close_s > 2 * grace_s + LINGER_EXTRA_S:
        return 0.0
    return min(grace_s, LINGER_MAX_S) + LINGER_EXTRA_S


LINGER_EXTRA_S, LINGER_MAX_S = 1.0, 2.0  # the checks start as the replies land: a few seconds cover them


def pick_device(device: str) -> str:
    """`--device`: 'auto' is CUDA when present."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    return device


STOP_SETTLE_S = 0.5
"""How long a node asked to stop waits for its open rounds' results before it leaves (a run that ends as planned
waits the grace window)."""
CHECKPOINT_WAIT_S = 120.0
"""The longest the training thread waits for the round checkpoint being written in the background: when leaving after
an error (a run that ends as planned writes its last one in place), and when the round in progress is overdue for a
save that waits for it (RoundLoop.run). A large path's files take seconds to tens of seconds."""
SECOND_SIGNAL_EXIT = 130
"""Exit code of a node stopped by a second SIGTERM or SIGINT before it finished leaving (as a shell's Ctrl-C)."""


def stop_on_signals(stop_event: threading.Event) -> None:
    """SIGTERM and SIGINT set `stop_event`: the node finishes its round and leaves the swarm. A second one, while it is
    still leaving, ends the process at once (its last checkpoint and saved round stay on disk; the next run resumes
    them), after writing every thread's stack to the log: what the leaving was waiting for."""

    def handler(signum, frame):
        if stop_event.is_set():
            logger.warning("signal %d again: exiting now, without leaving the swarm (the threads were at:)", signum)
            faulthandler.dump_traceback(all_threads=True)
            os._exit(SECOND_SIGNAL_EXIT)
        logger.info("signal %d: finishing the round and leaving the swarm (again to exit at once)", signum)
        stop_event.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def pace(t_step: float, tokens: int, max_tokens_per_s: float, stop_event: threading.Event) -> None:
    """Wait out what an inner step of `tokens` begun at `t_step` has left under the `--max-tokens-per-s` cap."""
    if max_tokens_per_s > 0:
        # Pace every step on its own: time lost to a frozen machine is not made up by running faster.
        ahead = t_step + tokens / max_tokens_per_s - time.perf_counter()
        if ahead > 0:
            stop_event.wait(ahead)


def validation_batches(spec, val: list, path: tuple[int, ...], n: int) -> list:
    """`n` batches of the validation documents routed to `path` (all of them, if the router sends it none)."""
    val_docs = documents_of_path(spec, val, path, allow_empty=True) or val
    return list(TokenSampler(val_docs, spec.model.context_len, seed=0).eval_batches(spec.inner.batch_size, n))


def farewell(code: int, *, stopped: bool, trained: bool, rounds_done: int, checkpoint_dir: str,
             durable: dict[str, int], open_rounds: list[str], partial_saved: bool) -> str:
    """The run's last line: why it ended, what is on disk, what was left unfinished."""
    why = "asked to stop" if stopped else "run ended"
    if not trained:
        kept = f" (the checkpoint in {checkpoint_dir} is as it was)" if checkpoint_dir else ""
        return f"left the swarm ({why} before training began: nothing new saved{kept}); exit {code}"
    saved = (f"checkpoint of round {max(durable.values())} in {checkpoint_dir}" if durable else
             "no checkpoint written" + ("" if checkpoint_dir else " (no --checkpoint-dir)"))
    left = (f"; the open round of {', '.join(open_rounds)} abandoned (its tokens count as unmerged; a restart counts "
            "them lost)" if open_rounds else "")
    return (f"left the swarm ({why}) after {rounds_done} round{'' if rounds_done == 1 else 's'}: {saved}"
            f"{'; the round in progress saved' if partial_saved else ''}{left}; exit {code}")
