"""What a member remembers it sent (protocol/rounds/member.py `Member._note_sent`), by value."""

from pathswarm.protocol.rounds.member import Member
from pathswarm.protocol.rounds.reducer_state import RESULTS_KEPT


def test_a_member_that_went_back_remembers_the_older_round_it_sends_now():
    """A node that went back to an older state (ahead alone, a heal) sends a round below those it sent: pruning to
    the newest RESULTS_KEPT rounds dropped it at once, and the node ended with a KeyError."""
    member = Member.__new__(Member)  # the record of sent frames needs no network
    member.sent = {}
    for r in range(15, 25):
        assert member._note_sent("L0M0", r, (100, f"h{r}")) == {(100, f"h{r}")}
    assert sorted(member.sent["L0M0"]) == list(range(25 - RESULTS_KEPT, 25))
    assert member._note_sent("L0M0", 14, (50, "back")) == {(50, "back")}
    assert 14 in member.sent["L0M0"] and len(member.sent["L0M0"]) == RESULTS_KEPT
    # a resend of the same round adds to its set (the reducer may answer from the older frame)
    assert member._note_sent("L0M0", 14, (60, "newer")) == {(50, "back"), (60, "newer")}
    assert member._note_sent("shared", 3, (1, "s")) == {(1, "s")} and 14 in member.sent["L0M0"]
