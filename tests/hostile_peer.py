"""A hostile peer for tests/swarm/test_hostile.py: test code, never part of the product.

It joins a swarm's DHT with a fresh identity, serves a forged state of the `shared` module far ahead of the honest
nodes (self-consistent: its digest matches its bytes), announces it on the DHT, and keeps sending the victim
contributions that claim that later round: before docs/SECURITY.md's vouching rule, one such message made the
victim re-sync the module from the sender, and a joiner took the newest announced state. Writes a JSON report of
what it sent and what the victim answered.

    python -m tests.hostile_peer SPEC INITIAL_PEER VICTIM_STATUS_JSON REPORT_JSON SECONDS
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from pathswarm.compression import encode
from pathswarm.node.model.model import count_module_params
from pathswarm.protocol.dht import announce_module
from pathswarm.protocol.net import start_net
from pathswarm.protocol.netloop import NetLoop
from pathswarm.protocol.records import ModuleAnnouncement
from pathswarm.protocol.rounds.exchange import ModuleExchange
from pathswarm.protocol.rounds.outer import OuterState, state_digest
from pathswarm.protocol.spec import load_spec

MODULE = "shared"
AHEAD = 50  # rounds ahead of the victim the forged state claims to be


def main(spec_path: str, initial_peer: str, victim_status: str, report: str, seconds: float) -> None:
    spec = load_spec(spec_path)
    numel = count_module_params(spec)[MODULE]
    deadline = time.monotonic() + 120
    while True:  # the victim's peer id and round, once it has trained a round
        try:
            victim = json.loads(Path(victim_status).read_text())
            if victim.get("round", 0) >= 1:
                break
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise SystemExit("the victim never trained a round")
        time.sleep(0.2)
    round_ = victim["round"] + AHEAD
    anchor = torch.full((numel,), 1e3)  # a model no honest round would ever reach
    momentum = torch.zeros(numel)
    digest = state_digest(anchor, momentum, round_)
    forged = OuterState(anchor, momentum, round_, ())
    sdht = start_net([initial_peer], spec=spec)
    loop = NetLoop()
    try:
        streams = loop.run(sdht.streams(), 30)
        exchange = ModuleExchange(spec, streams, sdht.peer_id, {MODULE: numel},
                                  lambda mid: forged if mid == MODULE else None)
        loop.run(exchange.start(), 30)
        announce_module(sdht, spec, ModuleAnnouncement(module_id=MODULE, round=round_, digest=digest,
                                                       peer_id=sdht.peer_id, numel=numel), ttl_s=120)
        print("announced", flush=True)  # the test starts a joiner now: the forged state is on offer
        frame = encode(torch.zeros(numel))
        answers: Counter[str] = Counter()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            result = loop.run(exchange.contribute([victim["peer_id"]], MODULE, round_, 640, digest, frame, 5.0), 15)
            answers[result.status] += 1
            time.sleep(0.5)
        Path(report).write_text(json.dumps({"peer_id": sdht.peer_id, "forged_round": round_, "forged_digest": digest,
                                            "answers": dict(answers)}))
    finally:
        loop.stop()
        sdht.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]))
