"""`pathswarm model pull`: download every module's current state from a running swarm into one whole model.

The puller joins the swarm's DHT as a client (it serves nothing, claims nothing, and no node waits for it or stops)
and accepts each module's state exactly as a joining node does (docs/SECURITY.md, node/peer/vouch.py): the newest
(round, digest) a strict majority of the module's holders in the claims announce (less the peers most of them
announce they caught lying), downloaded in parts from several of its holders at once when two or more can serve it,
else whole from one, and adopted only if the bytes hash to that digest and carry the reducer list its vouchers name.
Announcements lag a round behind training, so a module is looked at again, once a second, until the averaging
timeout. A module no majority vouches for is an error naming it: never a silent seed.

Resumable: every module is written to DIR/.pull/ as soon as it is accepted; an interrupted pull run again keeps
those (each checked against its digest) and downloads the rest. The whole model is written at the end
(node/train/model_dir.py) and the staging directory removed.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from pathswarm.node.model.model import count_module_params, new_module, unflatten_like
from pathswarm.node.peer.vouch import Announced, Vouched, counted_peers, majority_state, voted_out
from pathswarm.node.train.checkpoint import MOMENTUM_KEY, ModuleState, module_digest
from pathswarm.node.train.model_dir import write_model
from pathswarm.protocol.dht import read_claims, read_metrics, read_module_holders, read_revocations
from pathswarm.protocol.netloop import NetLoop
from pathswarm.protocol.rounds.exchange import ModuleExchange
from pathswarm.protocol.rounds.outer import OuterState
from pathswarm.protocol.rounds.reducers import list_digest
from pathswarm.protocol.rounds.state_parts import transfer_deadline_s
from pathswarm.protocol.spec import SwarmSpec, format_path
from pathswarm.protocol.swarm_view import counted_once

logger = logging.getLogger(__name__)

STAGING = ".pull"


class PullError(ValueError):
    """The swarm cannot give a whole model now; the message names the modules and why."""


@dataclass(frozen=True)
class Pulled:
    """One module as the pull accepted it."""

    module: str
    round: int
    digest: str
    source: str
    """Where its bytes came from ("3 holders in parts", "peer …abcd1234", "kept from the interrupted pull")."""
    vouchers: int
    """How many of the counted holders vouch for this state."""
    counted: int
    """How many holders were counted."""
    bytes: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"round": self.round, "digest": self.digest, "from": self.source, "vouchers": self.vouchers,
                "counted_holders": self.counted}


class Staging:
    """DIR/.pull: the modules accepted so far, one safetensors file each (weights, outer momentum; round, digest and
    reducer list in its metadata), written before the next module is asked for."""

    def __init__(self, spec: SwarmSpec, out_dir: Path):
        self.spec, self.dir = spec, out_dir / STAGING

    def put(self, mid: str, state: ModuleState, pulled: Pulled) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.contiguous() for k, v in state.weights.items()} | {MOMENTUM_KEY: state.momentum.contiguous()}
        tmp = self.dir / f".{mid}.tmp"
        save_file(tensors, str(tmp), metadata={"round": str(state.round), "reducers": json.dumps(state.reducers),
                                               "pulled": json.dumps(pulled.to_json())})
        tmp.replace(self.dir / f"{mid}.safetensors")

    def get(self, mid: str) -> tuple[ModuleState, dict[str, Any]] | None:
        """A module staged by an earlier run, if it reads back and hashes to the digest it was accepted at."""
        path = self.dir / f"{mid}.safetensors"
        if not path.is_file():
            return None
        try:
            with safe_open(str(path), "pt") as f:  # one read: the metadata and the tensors
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
            momentum = tensors.pop(MOMENTUM_KEY)
            template = new_module(self.spec, mid).state_dict()
            if set(tensors) != set(template):
                raise ValueError("parameter names differ from the spec's")
            state = ModuleState({k: tensors[k] for k in template}, momentum, int(meta["round"]),
                                tuple(json.loads(meta["reducers"])))
            pulled = json.loads(meta["pulled"])
            if module_digest(state) != pulled["digest"]:
                raise ValueError("does not hash to the digest it was accepted at")
        except (OSError, ValueError, KeyError, SafetensorError) as e:
            logger.warning("%s: staged by an earlier pull but unreadable (%s); downloading it again", path, e)
            return None
        return state, pulled

    def clear(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def pull_model(spec: SwarmSpec, initial_peers: tuple[str, ...], out_dir: str | Path, *, identity: str = "",
               membership: str = "", patience_s: float | None = None,
               on_module: Callable[[Pulled], None] = lambda p: None,
               on_bytes: Callable[[int], None] = lambda n: None) -> tuple[Path, list[Pulled]]:
    """Pull every module of the swarm into a whole model at `out_dir` (module docstring); returns its round directory
    and what was accepted per module. PullError when a module cannot be had (those accepted stay staged).
    `on_bytes(n)`: n more bytes of state arrived (a progress display; a failed attempt's bytes count too)."""
    from pathswarm.protocol.net import start_net

    out = Path(out_dir)
    staging = Staging(spec, out)
    patience = spec.averaging.timeout_s if patience_s is None else patience_s
    modules: dict[str, ModuleState] = {}
    pulled: dict[str, Pulled] = {}
    for mid in spec.all_module_ids():
        if (kept := staging.get(mid)) is not None:
            modules[mid] = kept[0]
            pulled[mid] = Pulled(mid, kept[0].round, kept[1]["digest"], "kept from the interrupted pull",
                                 kept[1].get("vouchers", 0), kept[1].get("counted_holders", 0), 0, 0.0)
            on_module(pulled[mid])
    tokens_trained = 0
    wanted = [mid for mid in spec.all_module_ids() if mid not in modules]
    if wanted:
        net = start_net(list(initial_peers), spec=spec, client_mode=True, identity_path=identity or None,
                        membership=membership)
        loop = NetLoop("pathswarm-pull")
        try:
            streams = loop.run(net.streams(), 30)
            puller_numels = count_module_params(spec)
            exchange = ModuleExchange(spec, streams, net.peer_id, puller_numels, lambda mid: None,
                                      membership=membership)
            read_revocations(net, spec)  # a private swarm: revoked peers' records no longer count
            puller = _Puller(spec, net, loop, exchange, staging, on_bytes, puller_numels)
            failed = puller.pull(wanted, patience, modules, pulled, on_module)
            tokens_trained = sum(m.tokens_trained for m in counted_once(read_metrics(net, spec)))
        finally:
            loop.stop()
            net.shutdown()
        if failed:
            done = len(spec.all_module_ids()) - len(failed)
            raise PullError(f"no whole model: {'; '.join(failed)}. {done} other module(s) are kept in "
                            f"{staging.dir}: run the same command again to pull the rest")
    provenance = {"kind": "pull", "pulled_at": int(time.time()), "tokens_trained": tokens_trained,
                  "initial_peers": list(initial_peers), "modules": {m: p.to_json() for m, p in pulled.items()}}
    round_dir = write_model(out, spec, modules, provenance)
    staging.clear()
    return round_dir, [pulled[mid] for mid in spec.all_module_ids()]


class _Puller:
    def __init__(self, spec: SwarmSpec, net, loop: NetLoop, exchange: ModuleExchange, staging: Staging,
                 on_bytes: Callable[[int], None], numels: dict[str, int]):
        self.spec, self.net, self.loop, self.exchange, self.staging = spec, net, loop, exchange, staging
        self.me, self.on_bytes = net.peer_id, on_bytes
        self.numels = numels  # count_module_params: built once, it instantiates a module of each kind

    def _download(self, coro, wait_s: float) -> OuterState | None:
        """Run a state download on the network loop (None when it does not end within wait_s), telling `on_bytes`
        what arrives meanwhile."""
        seen = self.exchange.traffic.received

        def tick() -> None:
            nonlocal seen
            now = self.exchange.traffic.received
            if now > seen:
                self.on_bytes(now - seen)
                seen = now

        try:
            return self.loop.run(coro, wait_s, tick=tick)
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            return None
        finally:
            tick()

    def pull(self, wanted: list[str], patience_s: float, modules: dict[str, ModuleState], pulled: dict[str, Pulled],
             on_module: Callable[[Pulled], None]) -> list[str]:
        """Pull each wanted module; returns one line per module that could not be had."""
        failed = []
        holders = self._holders()
        for mid in wanted:
            t0 = time.monotonic()
            deadline = t0 + patience_s
            why = ""
            while True:
                got, why = self._one(mid, holders.get(mid, set()))
                if got is not None or time.monotonic() > deadline:
                    break
                time.sleep(1.0)
                holders = self._holders()  # a node that claimed a path meanwhile counts from now
            if got is None:
                paths = ", ".join(format_path(p) for p in self.spec.paths() if mid in self.spec.module_ids(p))
                failed.append(f"module {mid} (paths {paths}): {why}")
                continue
            state, vouched, source, counted = got
            p = Pulled(mid, state.round, vouched.digest, source, len(vouched.vouchers), counted,
                       8 * state.momentum.numel(), time.monotonic() - t0)
            self.staging.put(mid, state, p)
            modules[mid], pulled[mid] = state, p
            on_module(p)
        return failed

    def _holders(self) -> dict[str, set[str]]:
        """Module → the peers whose live claims cover it."""
        out: dict[str, set[str]] = {}
        for claim in read_claims(self.net, self.spec):
            for mid in self.spec.module_ids(tuple(claim.path)):
                out.setdefault(mid, set()).add(claim.peer_id)
        return out

    def _one(self, mid: str, holders: set[str]) -> tuple[tuple[ModuleState, Vouched, str, int] | None, str]:
        """One attempt at a module: (state, what vouched for it, where from, holders counted), or (None, why not)."""
        if not holders:
            return None, "no node claims a path through it now (nobody serves it)"
        anns = read_module_holders(self.net, self.spec, mid)
        votes = {a.peer_id: a.distrusts for a in anns if a.distrusts}
        clients = {a.peer_id for a in anns if a.client}
        counted = counted_peers((), holders, self.me, voted_out(votes, holders, self.me))
        got = majority_state([Announced.of(a) for a in anns], self.me, counted)
        if got is None:
            seen = sorted({(a.round, a.digest[:12]) for a in anns if a.peer_id in counted})
            return None, (f"no strict majority of its {len(counted)} holders announces one state "
                          f"(announced: {', '.join(f'round {r} {d}' for r, d in seen) or 'nothing'})")
        servers = [p for p in got.peers if p not in clients]
        if not servers:
            return None, (f"round {got.round}, vouched for by {len(got.vouchers)} of {len(counted)} holders, is held "
                          "by no holder that can be dialed now")
        timeout_s = self.spec.averaging.timeout_s
        # a large state may take minutes from a home uplink; the transfer gives up when nothing arrives for timeout_s
        wait_s = transfer_deadline_s(timeout_s, 8 * self.numels[mid]) + 5
        state: OuterState | None = None
        source = ""
        if len(servers) >= 2:
            state = self._download(self.exchange.fetch_state_parts(servers, mid, timeout_s, got.round, got.digest),
                                   wait_s)
            source = f"{len(servers)} holders in parts"
        for peer in servers if state is None else ():
            state = self._download(self.exchange.fetch_state(peer, mid, timeout_s, got.round), wait_s)
            source = f"peer …{peer[-8:]}"
            if state is not None and (state.round, state.digest()) == (got.round, got.digest):
                break
        if state is None or (state.round, state.digest()) != (got.round, got.digest):
            return None, f"its holders did not serve round {got.round} (they may have moved on; looked again)"
        if got.reducers and list_digest(state.reducers) != got.reducers:
            return None, "the state came with a reducer list its vouchers do not announce"
        weights = unflatten_like(new_module(self.spec, mid).state_dict(), state.anchor)
        return (ModuleState(weights, state.momentum.clone(), state.round, state.reducers), got, source,
                len(counted)), ""
