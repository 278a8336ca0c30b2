"""A node's token counters survive restarts (node/peer/counters.py): saved with checkpoints and rounds in progress,
continued by the next run whatever its peer id, and what that run cannot take back counted as lost, so that
trained = merged + unmerged + discarded + lost holds before and after (real nodes SIGKILLed and restarted:
tests/swarm/test_resume.py, tests/swarm/test_one_version.py)."""

from __future__ import annotations

import json

from pathswarm.node.peer.counters import Counts, continued, newest, read_status_counts, restart_counts
from pathswarm.node.peer.node_status import NodeStatus
from pathswarm.node.peer.status import write_status
from pathswarm.node.train.checkpoint import load_checkpoint, save_checkpoint

from .test_checkpoint import SPEC, states

ID, OTHER = "a1" * 16, "b2" * 16


def adds_up(c: Counts, resumed: int) -> bool:
    return c.trained == c.merged + c.discarded + c.lost + resumed


def test_counts_read_back_as_written_and_refuse_what_is_not_ours():
    c = Counts(ID, trained=1000, merged=600, discarded=50, lost=100, reduced=4000, reduced_discarded=30)
    assert c.unmerged == 250
    assert Counts.from_json(json.loads(json.dumps(c.to_json()))) == c
    status = {"counters_id": ID, "tokens_trained": 1000, "tokens_merged": 600, "tokens_discarded": 50,
              "tokens_lost": 100, "tokens_reduced": 4000, "tokens_reduced_discarded": 30, "tokens_unmerged": 250}
    assert Counts.from_status(status) == c
    # a status file of an older version (no counters_id) or another node's garbage is never continued
    assert Counts.from_status({k: v for k, v in status.items() if k != "counters_id"}) is None
    for bad in ({"trained": -1}, {"trained": True}, {"trained": "5"}, {"trained": 1 << 63}, {"counters_id": "xyz"},
                {"merged": 2000}):  # merged > trained: unmerged < 0
        assert Counts.from_json({**c.to_json(), **bad}) is None, bad
    assert Counts.from_json(None) is None and Counts.from_json([1, 2]) is None


def test_the_newest_save_is_the_one_with_the_most_progress():
    ckpt = Counts(ID, trained=1000, merged=600)
    later = Counts(ID, trained=1200, merged=600)  # 200 more tokens trained since
    assert newest(ckpt, later) == newest(later, ckpt) == later
    healed = Counts(ID, trained=1000, merged=400, discarded=200)  # a healed split moved 200 merged to discarded
    assert newest(ckpt, healed) == healed
    reduced = Counts(ID, trained=1000, merged=600, reduced=500)  # only a round we reduced happened since
    assert newest(reduced, ckpt) == reduced
    assert newest(ckpt, Counts(OTHER, trained=9999)) == ckpt  # another node's save in the directory: ignored
    assert newest(None, None) is None and newest(None, ckpt) == ckpt


def test_a_restart_continues_the_counts_and_counts_what_it_cannot_take_back_as_lost():
    saved = Counts(ID, trained=1000, merged=600, discarded=0, lost=0, reduced=3000)
    # it resumed every unmerged token (its saved round in progress: 400 tokens of steps and carried steps)
    got = continued(saved, None, resumed_unmerged=400)
    assert got == saved and adds_up(got, 400)
    # it resumed only part of it (an outer gradient of 150 tokens was in flight: its steps are not saved)
    got = continued(saved, None, resumed_unmerged=250)
    assert (got.trained, got.merged, got.lost, got.reduced) == (1000, 600, 150, 3000) and adds_up(got, 250)
    # the last status file is newer: 300 tokens were trained after the save, then the node was killed
    last = Counts(ID, trained=1300, merged=600)
    got = continued(saved, last, resumed_unmerged=400)
    assert (got.trained, got.merged, got.lost) == (1300, 600, 300) and adds_up(got, 400)
    # a status file older than the save (written before it) changes nothing
    assert continued(saved, Counts(ID, trained=900, merged=600), 400) == saved
    # another node's status file at the same path is not ours to continue
    assert continued(saved, Counts(OTHER, trained=10 ** 9), 400) == saved
    # nothing resumed: everything unmerged is lost, trained and merged go on
    got = continued(saved, last, resumed_unmerged=0)
    assert (got.trained, got.merged, got.lost) == (1300, 600, 700) and adds_up(got, 0)


def test_counts_keep_adding_up_over_restarts():
    """Two restarts in a row: the second continues the first's counts, lost tokens accumulate, trained never drops."""
    first = continued(Counts(ID, trained=1000, merged=600), Counts(ID, trained=1100, merged=600), 200)
    assert (first.trained, first.lost) == (1100, 300)
    # the restarted run trains 500 more, merges 700 (its resumed 200 and 500 new), saves, then dies after 100 more
    saved = Counts(ID, trained=1600, merged=1300, lost=300)
    second = continued(saved, Counts(ID, trained=1700, merged=1300, lost=300), 0)
    assert (second.trained, second.merged, second.lost) == (1700, 1300, 400) and adds_up(second, 0)


def test_a_round_that_resumes_more_than_the_save_had_unmerged_is_still_counted_trained():
    got = continued(Counts(ID, trained=1000, merged=900), None, resumed_unmerged=300)
    assert (got.trained, got.lost) == (1200, 0) and adds_up(got, 300)


def test_nothing_saved_starts_afresh():
    got = continued(None, Counts(ID, trained=5000), 0, fresh_id=OTHER)
    assert got == Counts(OTHER)
    assert continued(None, None, 0).counters_id != continued(None, None, 0).counters_id  # drawn at random


def test_status_counts_round_trip_through_a_save(tmp_path):
    """What NodeStatus saves is what a restarted NodeStatus continues; the status file carries the same counts."""
    st = NodeStatus()
    st.counts_continued(Counts(ID, trained=100, merged=40, lost=10, reduced=70, reduced_discarded=5))
    st.stepped(1, 3.0, 64)
    st.round_settled("shared", 64, 0)
    st.took_stock(tokens_unmerged=50, tokens_reduced=90, settings=None)
    saved = st.counts()
    assert saved == Counts(ID, trained=164, merged=104, lost=10, reduced=90, reduced_discarded=5)
    write_status(str(tmp_path / "status.json"), st)
    assert read_status_counts(str(tmp_path / "status.json")) == saved
    got = json.loads((tmp_path / "status.json").read_text())
    assert got["tokens_trained"] == got["tokens_merged"] + got["tokens_unmerged"] + got["tokens_discarded"] + \
        got["tokens_lost"]
    again = NodeStatus()
    again.counts_continued(Counts.from_json(json.loads(json.dumps(saved.to_json()))))
    assert again.counts() == saved


def test_a_checkpoint_keeps_the_counters_and_a_restart_reads_them(tmp_path):
    counts = Counts(ID, trained=2000, merged=1500, reduced=800)
    save_checkpoint(tmp_path / "ckpt", SPEC, 3, states(SPEC, 3), counts.to_json())
    assert load_checkpoint(tmp_path / "ckpt", SPEC).counters == counts.to_json()
    save_checkpoint(tmp_path / "plain", SPEC, 3, states(SPEC, 3))  # swarm init, the simulator: none
    assert load_checkpoint(tmp_path / "plain", SPEC).counters is None
    # the previous run's status file is newer (300 tokens more) and nothing was resumed
    status = tmp_path / "status.json"
    status.write_text(json.dumps({"counters_id": ID, "tokens_trained": 2300, "tokens_merged": 1500,
                                  "tokens_reduced": 800}))
    partial = Counts(ID, trained=2100, merged=1500, reduced=800).to_json()  # a stale saved round in progress
    got = restart_counts([load_checkpoint(tmp_path / "ckpt", SPEC).counters, partial], str(status), 0)
    assert (got.counters_id, got.trained, got.merged, got.lost, got.reduced) == (ID, 2300, 1500, 800, 800)
    # no status file (the path is not set, or the file is gone): the steps after the last save are counted nowhere
    got = restart_counts([counts.to_json(), partial], "", 0)
    assert (got.trained, got.lost) == (2100, 600)
    assert restart_counts([None, None], str(status), 0).trained == 0  # nothing saved: a new node
