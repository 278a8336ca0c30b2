"""What the swarm looks like from its DHT records: paths, modules and totals, as pure data.

`collect_view` reads the records nodes publish (claims, module announcements, metrics); `summarize`
turns them into the rows `pathswarm swarm status` prints and its `--json` writes (with each path's
recent loss per round, which `--plot` draws). Replica agreement per module compares the digests announced
for the same round by every announcer, for every round seen (each peer announces the round it holds, so
holders that lag are compared among themselves too): a round announced with two digests is a split, one
version of each (module, round) in the whole swarm being the invariant.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pathswarm.protocol.records import ModuleAnnouncement, NodeMetrics, PathClaim
from pathswarm.protocol.spec import SwarmSpec, format_path


@dataclass
class SwarmView:
    claims: list[PathClaim] = field(default_factory=list)
    modules: dict[str, list[ModuleAnnouncement]] = field(default_factory=dict)
    metrics: list[NodeMetrics] = field(default_factory=list)


def collect_view(sdht, spec: SwarmSpec) -> SwarmView:
    from pathswarm.protocol.dht import read_claims, read_metrics, read_module_holders

    return SwarmView(claims=read_claims(sdht, spec),
                     modules={mid: read_module_holders(sdht, spec, mid) for mid in spec.all_module_ids()},
                     metrics=read_metrics(sdht, spec))


def _path_history(metrics: list[NodeMetrics]) -> list[list[float]]:
    """[[round, mean training loss of the path's nodes at that round], …] from the nodes' metrics."""
    by_round: dict[int, list[float]] = {}
    for m in metrics:
        for r, loss in m.history:
            by_round.setdefault(r, []).append(loss)
    return [[r, sum(v) / len(v)] for r, v in sorted(by_round.items())]


def replica_agreement(announcements: list[ModuleAnnouncement]) -> dict:
    """One module's replica agreement from its announcements: the digests announced for each round, compared
    across every announcer of that round, whatever round is newest.

    `replicas_agree`: False when a round was announced with two or more digests, True when at least one round
    had two announcers and none was split, None when no round had two announcers (nothing to compare).
    `split_rounds`: those rounds, ascending; `split_digests`: round (str) → digest → announcing peer ids.
    `rounds_compared`: rounds with two or more announcers."""
    by_round: dict[int, dict[str, list[str]]] = {}
    for a in announcements:
        peers = by_round.setdefault(a.round, {}).setdefault(a.digest, [])
        if a.peer_id not in peers:
            peers.append(a.peer_id)
    compared = [r for r, digests in by_round.items() if sum(len(p) for p in digests.values()) >= 2]
    split = sorted(r for r, digests in by_round.items() if len(digests) >= 2)
    return {
        "replicas_agree": (not split) if compared else None,
        "rounds_compared": len(compared),
        "split_rounds": split,
        "split_digests": {str(r): {d: sorted(p) for d, p in sorted(by_round[r].items())} for r in split},
    }


def summarize(spec: SwarmSpec, view: SwarmView) -> dict:
    metrics = {m.peer_id: m for m in view.metrics}
    paths = []
    for p in spec.paths():
        servers = [c for c in view.claims if tuple(c.path) == p]
        ms = [metrics[c.peer_id] for c in servers if c.peer_id in metrics]
        paths.append({
            "path": format_path(p),
            "nodes": [c.peer_id for c in servers],
            "tokens_per_s": sum(m.tokens_per_s for m in ms),
            "last_round": max((m.round for m in ms), default=None),
            "loss": (sum(m.loss for m in ms) / len(ms)) if ms else None,
            "history": _path_history(ms),
        })
    modules = []
    for mid in spec.all_module_ids():
        anns = view.modules.get(mid, [])
        newest = max((a.round for a in anns), default=None)
        agreement = replica_agreement(anns)
        modules.append({
            "module": mid,
            "round": newest,
            "holders": len({a.peer_id for a in anns}),
            "holders_at_round": sum(1 for a in anns if a.round == newest),
            **agreement,
        })
    return {
        "swarm_id": spec.swarm_id,
        "name": spec.name,
        "paths": paths,
        "modules": modules,
        "totals": {
            "nodes": len({c.peer_id for c in view.claims}),
            "paths_served": sum(1 for p in paths if p["nodes"]),
            "tokens_per_s": sum(m.tokens_per_s for m in view.metrics),
            "bytes_sent": sum(m.bytes_sent for m in view.metrics),
            "bytes_received": sum(m.bytes_received for m in view.metrics),
        },
    }
