"""The test-only seam of a reducer's replies (protocol/rounds/reply_faults.py): a node without the test variables keeps
no fault object, a dropped reply is dropped once, and a "die" fault picks exactly one member to answer, once per
arming. (That the process then exits, and what the swarm makes of it: tests/swarm/test_split_heals.py.)"""

import asyncio

from pathswarm.protocol.rounds.exchange import ModuleExchange
from pathswarm.protocol.rounds.messages import RoundReply
from pathswarm.protocol.rounds.reply_faults import ANY_ROUND, ReplyFaults
from pathswarm.protocol.spec import SwarmSpec

MEMBERS = ("peer-a", "peer-b", "peer-c")


def reply(module="shared", round_=3, contributors=("me", *MEMBERS)) -> RoundReply:
    return RoundReply(module, round_, "merged", contributors=contributors, mean_frame=b"mean")


def test_a_production_node_keeps_no_fault_object():
    exchange = ModuleExchange(SwarmSpec(), None, "me", {"shared": 8}, lambda mid: None)
    assert exchange.service.faults is None
    exchange.drop_replies(set(), {}, "")
    assert exchange.service.faults is None
    exchange.drop_replies({("shared", 2)})
    assert exchange.service.faults is not None and exchange.service.faults.drop == {("shared", 2)}


def test_a_dropped_reply_is_dropped_once_and_others_go_out():
    faults = ReplyFaults(drop={("shared", 3)})
    sent = []

    async def send():
        sent.append(1)

    async def go():
        first = await faults.before_reply("shared", 3, "peer-a", "me", reply(), send)
        again = await faults.before_reply("shared", 3, "peer-b", "me", reply(), send)
        other = await faults.before_reply("L0M0", 3, "peer-a", "me", reply("L0M0"), send)
        return first, again, other

    assert asyncio.run(go()) == (True, False, False)
    assert sent == []  # a dropped reply is not written; the others are written by the caller


def test_die_picks_one_member_once_per_arming(tmp_path):
    arm = tmp_path / "arm"
    arm.touch()
    faults = ReplyFaults(die={("shared", ANY_ROUND): "last"}, exit_arm=str(arm))

    async def decide(sender, round_=3, contributors=("me", *MEMBERS)):
        try:
            return await asyncio.wait_for(faults._dying_reply("shared", round_, sender, "me",
                                                              reply(round_=round_, contributors=contributors)), 0.2)
        except TimeoutError:
            return "held"  # a reply held back until the process is gone

    assert asyncio.run(decide("peer-c")) is True  # the last by peer id gets the one reply
    assert not arm.exists()  # this process took the arming
    assert asyncio.run(decide("peer-a")) == "held"
    assert asyncio.run(decide("peer-c", round_=4)) is False  # no arming left: rounds go on as usual
    # a round with one other member has nobody to split from: never a death
    fresh = ReplyFaults(die={("shared", 3): "first"})
    assert asyncio.run(asyncio.wait_for(fresh._dying_reply("shared", 3, "peer-a", "me",
                                                           reply(contributors=("me", "peer-a"))), 0.2)) is False
