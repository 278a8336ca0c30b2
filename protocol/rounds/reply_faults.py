"""Fault injection in a reducer's replies, for the test suite and benchmarks/restarts.py only.

A production node never builds one: `Service.faults` stays None unless node/peer/faults.py read the test variables
(PATHSWARM_TEST_DROP_REPLY, PATHSWARM_TEST_EXIT_ARM), and then the node says so in its log first. The reply path
asks it one question per reply (`ReplyFaults.before_reply`); everything else of the faults lives here.

- drop: as the reducer of these (module, round)s, close the reply unsent, as if the connection broke after the merge;
- die: as the reducer of these rounds (round -1: any), reply to one member of a round with two or more others ("first":
  the one whose peer id sorts first, "last": last), then exit the process hard before the next reply: a reducer
  killed between two members' replies. With an arming file, a process dies so only if it removes the file first: one
  death per arming in the whole swarm.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from pathswarm.protocol.rounds.messages import RoundReply
from pathswarm.protocol.rounds.slices import module_of_unit

logger = logging.getLogger(__name__)

DIE_REPLYING_EXIT = 86
"""Exit code of a process that the `die` fault ended (tests tell it from a crash)."""
ANY_ROUND = -1
"""A `die` entry's round for "any round of the module" (benchmarks/restarts.py arms each kill with a file)."""


@dataclass
class ReplyFaults:
    drop: set[tuple[str, int]] = field(default_factory=set)
    die: dict[tuple[str, int], str] = field(default_factory=dict)
    """(module, round or ANY_ROUND) → which member gets its reply before the process exits: "first" or "last"."""
    exit_arm: str = ""
    _dies: dict[tuple[str, int], bool] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.drop or self.die)

    async def before_reply(self, module: str, round_: int, sender: str, me: str, result: RoundReply,
                           send: Callable[[], Awaitable[None]]) -> bool:
        """True when the fault took the reply over (dropped it, or sent it and ended the process); False: reply as
        usual. May hold the reply back for good (the other members' replies while this process is dying)."""
        if (module, round_) in self.drop and result.applicable:
            self.drop.discard((module, round_))
            logger.warning("fault injection: the reply of %s round %d to %s is dropped", module, round_, sender[-8:])
            return True
        if not await self._dying_reply(module, round_, sender, me, result):
            return False
        await send()
        logger.warning("fault injection: replied to %s for %s round %d; exiting before the next reply", sender[-8:],
                       module, round_)
        logging.shutdown()
        os._exit(DIE_REPLYING_EXIT)

    async def _dying_reply(self, module: str, round_: int, sender: str, me: str, result: RoundReply) -> bool:
        """True for the one reply after which the process exits. Only a round with two members besides us (one gets
        the result, the other not); the other members' replies wait until the process is gone."""
        whole = module_of_unit(module)  # a slice's reducer (slices.py) dies as its module's would
        which = (self.die.get((module, round_)) or self.die.get((whole, round_)) or self.die.get((whole, ANY_ROUND)))
        others = sorted(set(result.contributors) - {me})
        if which is None or not result.applicable or len(others) < 2:
            return False  # not a round with two members to split between (a late answer of a version alone, say)
        if (module, round_) not in self._dies:  # decided once per round, before any of its replies is held
            self._dies = {k: v for k, v in list(self._dies.items())[-16:]}
            self._dies[(module, round_)] = self._armed()
        if not self._dies[(module, round_)]:
            return False
        if sender != (others[0] if which == "first" else others[-1]):
            await asyncio.Event().wait()
        return True

    def _armed(self) -> bool:
        if not self.exit_arm:
            return True
        try:
            os.unlink(self.exit_arm)  # atomic: of the processes that try, one removes it
            return True
        except FileNotFoundError:
            return False
