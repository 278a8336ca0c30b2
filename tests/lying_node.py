"""A node that lies as a reducer, for tests/swarm/test_hostile.py: test code, never part of the product.

It is a real `pathswarm node run` (same CLI, same protocol) whose round rule is swapped for one that, in rounds
that merge at least GROUP contributions, sends its group the sign-flipped mean of them, and applies that same lie
itself, so its announced digest agrees with what its members reach: only an audit can tell (docs/SECURITY.md).

    python -m tests.lying_node GROUP node run ...
"""

from __future__ import annotations

import logging
import sys

from pathswarm.node.peer import node as node_module
from pathswarm.node.peer.rounds import exchange_closer
from pathswarm.node.train.outer import OuterState
from pathswarm.node.train.round import decode_mean, encode_mean
from pathswarm.protocol.exchange import Closed, LocalState

logger = logging.getLogger("lying_node")


def lying_closer(spec, group: int):
    honest = exchange_closer(spec)

    def close(contributions, numel, before):
        c = honest(contributions, numel, before)
        if before is None or not c.mean_frame or len(c.used) < group:
            return c
        lie = encode_mean(-decode_mean(c.mean_frame, numel, spec.codec), spec.codec)
        st = OuterState(before.anchor.clone(), before.momentum.clone(), before.round)
        st.apply(decode_mean(lie, numel, spec.codec), spec.outer)
        logger.warning("LYING: round %d merged %d contributions, sending the sign-flipped mean", before.round,
                       len(c.used))
        return Closed(lie, c.used, c.tokens, c.rejected, LocalState(st.round, st.digest(), st.anchor, st.momentum))

    return close


if __name__ == "__main__":
    group = int(sys.argv[1])
    node_module.exchange_closer = lambda spec: lying_closer(spec, group)
    sys.argv = ["pathswarm", *sys.argv[2:]]
    from pathswarm.node.app.cli import main

    main()
