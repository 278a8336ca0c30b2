"""A node that lies as a reducer, for tests/swarm/test_hostile.py: test code, never part of the product.

It is a real `pathswarm node run` (same CLI, same protocol) whose round rule is swapped for one that, in rounds
that merge at least GROUP contributions, from round AFTER of the module on (0: from the first), sends its group
FACTOR × their mean (default -1: the sign-flipped mean; FACTOR "noiseK": their mean plus random noise K times its
norm, which keeps a positive cosine with every member's outer gradient), and applies that same lie itself, so its
announced digest agrees with what its members reach: only an audit (or, for a large FACTOR, the members' bound) can
tell (docs/SECURITY.md). AFTER past its checked rounds makes a reducer that turns hostile once trusted (issue 27).

    python -m tests.lying_node GROUP [AFTER [FACTOR]] node run ...
"""

from __future__ import annotations

import logging
import sys

import torch

from pathswarm.protocol.rounds import exchange as exchange_module
from pathswarm.protocol.rounds.rule import ClosedRound, close_round, decode_mean, encode_mean

logger = logging.getLogger("lying_node")


def lying_closer(group: int, after: int = 0, factor: float | str = -1.0):
    def close(spec, contributions, numel, before):
        c = close_round(contributions, numel, spec, before)
        if before is None or not c.mean_frame or len(c.used) < group or before.round < after:
            return c
        mean = decode_mean(c.mean_frame, numel, spec.codec)
        if isinstance(factor, str):  # "noiseK"
            noise = torch.randn(numel, generator=torch.Generator().manual_seed(before.round))
            lie = encode_mean(mean + noise * (float(factor[5:]) * float(mean.norm()) / float(noise.norm())), spec.codec)
        else:
            lie = encode_mean(factor * mean, spec.codec)
        lied = before.stepped(decode_mean(lie, numel, spec.codec), spec.outer)
        logger.warning("LYING: round %d merged %d contributions, sending %s x their mean", before.round,
                       len(c.used), factor)
        return ClosedRound(lie, c.used, c.tokens, c.rejected, lied)

    return close


if __name__ == "__main__":
    group = int(sys.argv[1])
    after = int(sys.argv.pop(2)) if sys.argv[2].isdigit() else 0
    factor: float | str = -1.0
    if sys.argv[2] not in ("node", "swarm"):
        factor = sys.argv.pop(2)
        factor = factor if factor.startswith("noise") else float(factor)
    exchange_module.rule_closer = lying_closer(group, after, factor)  # every exchange built from now on closes with it
    sys.argv = ["pathswarm", *sys.argv[2:]]
    from pathswarm.node.app.cli import main

    main()
