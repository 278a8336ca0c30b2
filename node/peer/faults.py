"""Fault injection for the test suite and benchmarks/restarts.py only: read from the environment at a node's start.

Kept out of the round's own code (node/peer/rounds.py): a node with none of these variables set never reaches it
beyond the read, and one with them says so in its log before anything else.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)


def faults_from_env() -> tuple[set[tuple[str, int]], dict[tuple[str, int], str], str]:
    """Fault injection for tests: PATHSWARM_TEST_DROP_REPLY="MODULE:ROUND,…" makes this node, as the reducer of
    those rounds, close its reply to their members unsent (as if the connection broke after the merge);
    "MODULE:ROUND:exit" (or ":exit-last"; ROUND "*": any) instead replies to one member of the round, the one whose
    peer id sorts first (last), and exits the process (os._exit) before the others' replies: a reducer killed while
    replying (tests/swarm/test_split_heals.py, benchmarks/restarts.py). PATHSWARM_TEST_EXIT_ARM=FILE: a process dies
    so only if it removes FILE first: one death per arming in the whole swarm. Returns (dropped, (module, round or
    -1) → "first" | "last", FILE)."""
    drop, die = set(), {}
    for item in filter(None, os.environ.get("PATHSWARM_TEST_DROP_REPLY", "").split(",")):
        head, _, tail = item.rpartition(":")
        if tail in ("exit", "exit-last"):
            module, _, round_ = head.rpartition(":")
            die[(module, -1 if round_ == "*" else int(round_))] = "last" if tail == "exit-last" else "first"
        else:
            drop.add((head, int(tail)))
    if drop or die:  # never silent: a node that drops or dies on purpose says so first
        logger.warning("fault injection for tests is on (PATHSWARM_TEST_DROP_REPLY): this node will drop or die "
                       "while replying to rounds of %s", ", ".join(sorted({m for m, _ in drop | set(die)})))
    return drop, die, os.environ.get("PATHSWARM_TEST_EXIT_ARM", "")
