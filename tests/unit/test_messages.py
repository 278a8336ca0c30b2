"""The round's typed messages (protocol/rounds/messages.py): each writes a header its own parser reads back equal, and
a header a stranger bends (wrong types, out-of-range numbers, unknown statuses) is a WireError, never another
exception; optional parts of a reply that do not parse are dropped, as the member's check relies on."""

import pytest

from pathswarm.protocol.rounds.frame_list import frame_hash
from pathswarm.protocol.rounds.messages import (
    MAX_CONTRIBUTORS,
    MAX_ROUND,
    AlertRequest,
    ContributeRequest,
    FrameHeader,
    FramesReply,
    FramesRequest,
    Refusal,
    RoundReply,
    RoundStatus,
    StanceReply,
    StanceRequest,
    StateReply,
    StateRequest,
)
from pathswarm.protocol.rounds.reducers import Stance
from pathswarm.protocol.wire import WireError

H = frame_hash(b"frame")
MESSAGES = [
    ContributeRequest("L0M0", 3, 640, "ab" * 32, "cert", client=True),
    # as a member reads it: the frames' hashes stay with the reducer (`frames`), the list travels as (peer, tokens),
    # one commitment and the member's own entry
    RoundReply("L0M0", 3, RoundStatus.MERGED, ("QmA", "QmB"), 1280, "cd" * 32, "", ("QmA", "QmB"), "",
               listed=(("QmA", 640), ("QmB", 641)), frames_digest="ef" * 32, own=H),
    RoundReply("L0M0", 3, RoundStatus.REDIRECT, reason="QmA holds this round", redirect="QmA"),
    StanceRequest("shared", 7, "ab" * 32, "cert"),
    StanceReply(Stance.OPEN),
    StateRequest("L1M1", "cert"),
    StateReply("ok", 9, "ef" * 32, ("QmA",)),
    FramesRequest("L0M0", 3, "QmA", "cert"),
    FramesReply("ok", 2),
    FrameHeader("QmB", 640),
    AlertRequest("L0M0", 3, "QmLiar", "cert"),
    StateRequest("L1M1", "cert", 12),  # the vouched round wanted (issue 27)
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_reads_back_what_it_wrote(msg):
    assert type(msg).parse(msg.header()) == msg


def test_a_status_is_one_key_with_its_wire_string():
    assert RoundStatus("merged") == "merged" and {RoundStatus.MERGED} == {"merged"}
    assert {"late": 1}[RoundStatus.LATE] == 1
    assert RoundStatus.ALONE.applies and RoundStatus.ALONE.ours and RoundStatus.LATE.applies
    assert not RoundStatus.LATE.ours and not RoundStatus.FAILED.applies
    assert RoundReply("m", 0, "late").status is RoundStatus.LATE  # a plain string names one too


@pytest.mark.parametrize("bad", [
    {"round": "3"}, {"round": -1}, {"round": MAX_ROUND + 1}, {"round": True}, {"round": 1.0},
    {"module": 7}, {"module": "m" * 200}, {"digest": None}, {"tokens": "640"}, {"tokens": False},
])
def test_a_bent_contribution_header_is_a_wire_error(bad):
    header = {**ContributeRequest("L0M0", 3, 640, "ab" * 32).header(), **bad}
    with pytest.raises(WireError):
        ContributeRequest.parse(header)


def test_a_token_count_out_of_range_is_parsed_for_the_reducer_to_refuse_with_a_reason():
    # the reducer answers "token count too large" for that contribution alone (tests/unit/test_fuzz_parsers.py)
    assert ContributeRequest.parse({**ContributeRequest("m", 0, 1, "d").header(), "tokens": 10**400}).tokens == 10**400


def test_a_reply_with_an_unknown_status_is_a_wire_error_and_bad_optional_parts_are_dropped():
    good = MESSAGES[1].header()
    with pytest.raises(WireError, match="unknown round status"):
        RoundReply.parse({**good, "status": "victory"})
    bent = RoundReply.parse({**good, "frames": [["QmA", -5, "zz"]], "reducers": ["not a peer id!"], "tokens": -3,
                             "contributors": ["QmA"] * (MAX_CONTRIBUTORS + 10), "reason": "x" * 5000})
    assert bent.frames == () and bent.reducers == () and bent.tokens == 0  # the member then finds its entry missing
    assert len(bent.contributors) == MAX_CONTRIBUTORS and len(bent.reason) == 200


def test_replies_that_are_not_what_they_say():
    assert Refusal.parse({"status": "refused", "reason": "rate limited"}) == Refusal("rate limited")
    assert Refusal.parse({"status": "ok"}) is None
    assert StateReply.parse({"status": "missing"}).status == "missing"
    for bent in ({"round": "x"}, {"round": [1]}, {"round": -1}, {"reducers": "QmA"}, {"digest": "d" * 65}):
        with pytest.raises(WireError):
            StateReply.parse({**MESSAGES[6].header(), **bent})
    with pytest.raises(WireError):
        StanceReply.parse({"stance": "maybe"})
    with pytest.raises(WireError):
        FramesReply.parse({"status": "ok", "count": MAX_CONTRIBUTORS + 1})


def test_a_result_says_its_contributors_and_a_sorted_candidate_list_once():
    """The contributors are the frame list's peers and a round in slices names them, sorted, as the next candidates:
    both lists travel once (a reply of 16 members carried each three times, a third of a small slice's mean), and the
    frames' hashes travel as one commitment plus the member's own entry (protocol v5)."""
    import json

    from pathswarm.protocol.rounds.frame_list import commit_frames
    from pathswarm.protocol.rounds.messages import SORTED_CONTRIBUTORS, RoundStatus

    peers = tuple(f"Qm{i:044d}" for i in range(16))
    frames = tuple((p, 10, f"{i:064x}") for i, p in enumerate(peers))
    sliced = RoundReply("m[1/16]", 3, "merged", peers, 160, "cd" * 32, reducers=peers, frames=frames)
    head = sliced.to(peers[4], RoundStatus.MERGED).header()
    assert head["reducers"] == SORTED_CONTRIBUTORS and head["frame_tokens"] == 10 and "listed" not in head
    assert len(json.dumps(head)) < 1300  # 16 entries: 2.3 KB with a hash each (protocol v4)
    back = RoundReply.parse(json.loads(json.dumps(head)), b"x")
    assert back.contributors == peers and back.reducers == peers
    assert back.listed == tuple((p, 10) for p in peers) and back.frames == ()  # the hashes stay with the reducer
    assert back.frames_digest == commit_frames(frames) and back.own == frames[4][2]
    assert RoundReply.parse(sliced.to("QmLate", RoundStatus.LATE).header()).own == ""  # not listed: no entry
    # unequal token counts travel one per contributor
    mixed = tuple((p, 10 + i, h) for i, (p, _, h) in enumerate(frames))
    assert RoundReply.parse(RoundReply("m", 3, "merged", peers, 1, "", frames=mixed).header()).listed == tuple(
        (p, t) for p, t, _ in mixed)
    # a list that is not the sorted contributors (one reducer's: itself first) is sent as it is
    star = RoundReply("m", 3, "merged", peers, 160, "cd" * 32, reducers=(peers[5], *peers[:5], *peers[6:]),
                      frames=frames)
    assert RoundReply.parse(star.header()).reducers == star.reducers
    # contributors other than the frame list's peers (a liar's, or a failed round's) are sent, and the member's check
    # compares the two (protocol/rounds/member.py)
    odd = RoundReply.parse(RoundReply("m", 3, "merged", peers[:3], 30, "", frames=frames[:2]).header())
    assert odd.contributors == peers[:3] and odd.listed == ((peers[0], 10), (peers[1], 10))
    assert RoundReply.parse(RoundReply("m", 3, "failed", reason="x").header()).contributors == ()
    # a commitment that is not sha256 hex, or token counts that do not match the contributors, list nothing
    for bad in ({"frames_digest": "zz"}, {"frame_tokens": [10, 10]}, {"frame_tokens": True}, {"own": "x"}):
        got = RoundReply.parse({**head, **bad})
        assert (got.listed == () and got.frames_digest == "") if "own" not in bad else got.own == ""
