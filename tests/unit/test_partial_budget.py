"""Saving the round in progress stays within its share of training time, forced saves included (node/peer/resume.py)."""

import time

from pathswarm.node.peer.config import PARTIAL_COST_SHARE, NodeConfig
from pathswarm.node.peer.resume import PartialRounds
from pathswarm.protocol.spec import SwarmSpec


class _Work:
    def __call__(self, kind):
        import contextlib
        return contextlib.nullcontext()


def test_a_send_or_a_new_anchor_waits_for_the_budget(tmp_path):
    partial = PartialRounds(NodeConfig(spec=SwarmSpec(), checkpoint_dir=str(tmp_path), partial_every_s=0.01), None)
    saves = []

    def slow_save():  # a big model's save
        saves.append(time.perf_counter())
        time.sleep(0.01)

    partial.maybe_save(slow_save, _Work())
    assert len(saves) == 1 and partial.earliest >= saves[0] + PARTIAL_COST_SHARE * 0.01
    partial.on_send()  # the saved round is discarded, but the next save still waits for the budget
    partial.renew_next_step()
    partial.maybe_save(slow_save, _Work())
    assert len(saves) == 1
    partial.earliest = partial.next_save = 0.0  # the budget allows it: the next step saves
    partial.maybe_save(slow_save, _Work())
    assert len(saves) == 2
