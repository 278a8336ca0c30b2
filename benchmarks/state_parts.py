"""A joiner's download of a path's state from 4 holders at once (in parts) against the same download from one holder,
with every holder's upload capped as a home uplink caps it (issue 28, item 5).

Five DHT peers on 127.0.0.1, each with its own module exchange (real p2pd streams): four hold the same state of
every module of one path of a 1x1 spec at width 512 with 4 layers per module (25.5 M parameters, the `25m` size of
benchmarks/overhead.py: 204 MB of anchor and momentum), each serving states at `--cap-mbps` (the node's
`--serve-state-mbps`); the fifth downloads the path, module after module, as a node does: whole from one holder
(`fetch_state`, what every node did before parts), then in parts from all four (`fetch_state_parts`). Every download
is checked bit for bit against the state. Loopback itself is not the limit: its throughput is measured uncapped too.

    python benchmarks/state_parts.py                     # → benchmarks/results/state_parts.json (~2 min)

Goal (issue 28): from 4 holders ≤ 0.4 × the time from one.
"""

from __future__ import annotations

import time

import torch
from _swarm_common import arguments, machine, write_json

from pathswarm.node.model.model import count_module_params
from pathswarm.protocol.net import start_net
from pathswarm.protocol.netloop import NetLoop
from pathswarm.protocol.rounds.exchange import ModuleExchange
from pathswarm.protocol.rounds.outer import OuterState
from pathswarm.protocol.spec import ModelSpec, SwarmSpec

GOAL = 0.4


def main() -> None:
    ap = arguments(__doc__, "state_parts")
    ap.add_argument("--cap-mbps", type=float, default=100.0, help="each holder's upload cap (megabits per second)")
    ap.add_argument("--holders", type=int, default=4)
    args = ap.parse_args()
    spec = SwarmSpec(name="state-parts-bench", levels=(1, 1),
                     model=ModelSpec(width=512, base_width=128, n_heads=8, layers_per_module=4, context_len=128))
    path = spec.path_of_index(0)
    numels = {mid: n for mid, n in count_module_params(spec).items() if mid in spec.module_ids(path)}
    gen = torch.Generator().manual_seed(0)
    states = {mid: OuterState(torch.randn(n, generator=gen), torch.randn(n, generator=gen), 40, ("QmA", "QmB"))
              for mid, n in numels.items()}
    net, nets, exchanges = NetLoop("bench"), [], []
    try:
        nets.append(start_net(spec=spec))
        for _ in range(args.holders):
            nets.append(start_net(nets[0].visible_maddrs(), spec=spec))
        for i, sdht in enumerate(nets):
            held = None if i == 0 else states
            ex = ModuleExchange(spec, net.run(sdht.streams(), 30), sdht.peer_id, numels,
                                lambda m, h=held: h[m] if h else None,
                                serve_state_bytes_per_s=0.0 if i == 0 else args.cap_mbps * 1e6 / 8)
            net.run(ex.start(), 30)
            exchanges.append(ex)
        joiner, holders = exchanges[0], [n.peer_id for n in nets[1:]]

        def download(how: str) -> float:
            t0 = time.monotonic()
            for mid, want in states.items():
                if how == "one":
                    got = net.run(joiner.fetch_state(holders[0], mid, 600, want.round), 700)
                else:
                    got = net.run(joiner.fetch_state_parts(holders, mid, 600, want.round, want.digest()), 700)
                if got is None or not (torch.equal(got.anchor, want.anchor) and torch.equal(got.momentum,
                                                                                            want.momentum)):
                    raise SystemExit(f"the {how} download of {mid} did not give the state")
            took = time.monotonic() - t0
            print(f"{how}: {took:.1f} s", flush=True)
            return took

        one = download("one")
        time.sleep(1.5)  # the holders' one-second bursts refill, for both arms alike
        parts = download("parts")
        for ex in exchanges[1:]:  # loopback's own speed: the same download, uncapped
            assert ex.ctx.state_pacer is not None
            ex.ctx.state_pacer.bytes_per_s = 0.0
        uncapped_one = download("one")
    finally:
        net.stop()
        for sdht in reversed(nets):
            sdht.shutdown()
    size = sum(8 * n for n in numels.values())
    ratio = parts / one
    write_json(args.json, {
        "benchmark": "state_parts", "machine": machine(), "params_per_path": sum(numels.values()),
        "state_bytes": size, "holders": args.holders, "cap_mbps_per_holder": args.cap_mbps,
        "seconds_from_one": round(one, 2), "seconds_in_parts": round(parts, 2),
        "seconds_from_one_uncapped": round(uncapped_one, 2),
        "mbps_from_one": round(size * 8 / one / 1e6, 1), "mbps_in_parts": round(size * 8 / parts / 1e6, 1),
        "parts_vs_one": round(ratio, 3), "goal": f"<= {GOAL}", "meets_goal": ratio <= GOAL,
    })
    print(f"{size / 1e6:.0f} MB: from one holder {one:.1f} s, in parts from {args.holders} {parts:.1f} s "
          f"({ratio:.2f}x; goal <= {GOAL}); uncapped from one {uncapped_one:.1f} s")


if __name__ == "__main__":
    main()
