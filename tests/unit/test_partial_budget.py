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


def test_a_save_is_overdue_once_due_for_a_further_interval(tmp_path):
    """What lets an overdue save wait for a checkpoint still being written (RoundLoop.run): due is not overdue."""
    partial = PartialRounds(NodeConfig(spec=SwarmSpec(), checkpoint_dir=str(tmp_path), partial_every_s=5.0), None)
    now = time.perf_counter()
    partial.next_save = now - 1.0  # due a second ago
    assert not partial.overdue()
    partial.next_save = now - 6.0  # due for more than partial_every_s
    assert partial.overdue()
    off = PartialRounds(NodeConfig(spec=SwarmSpec(), checkpoint_dir="", partial_every_s=5.0), None)
    off.next_save = now - 60.0
    assert not off.overdue()  # no checkpoint folder: never saved, never overdue
