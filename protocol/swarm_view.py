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
    """One module's replica agreement from its announcements: the digests announced for each round (each holder's
    state and the last few before it, `ModuleAnnouncement.chain`), compared across every announcer of that round,
    whatever round is newest.

    `replicas_agree`: False when a round was announced with two or more digests, True when at least one round
    had two announcers and none was split, None when no round had two announcers (nothing to compare).
    `split_rounds`: those rounds, ascending; `split_digests`: round (str) → digest → announcing peer ids.
    `rounds_compared`: rounds with two or more announcers."""
    by_round: dict[int, dict[str, list[str]]] = {}
    for a in announcements:
        # the announced state and the ones its holder held just before it: holders a round or two apart are
        # compared too (a holder that went on alone after a split announced no round the others did)
        for round_, digest in [*((r, d) for r, d, _ in a.chain), (a.round, a.digest)]:
            peers = by_round.setdefault(round_, {}).setdefault(digest, [])
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


def ddp_fp32_bytes(path_params: int, inner_steps: int, n_nodes: int) -> int:
    """What one node of fp32 data-parallel training sends for `inner_steps` steps of a `path_params` model among
    `n_nodes`: a ring all-reduce of the gradient every step moves 2(n-1)/n of it out of each node."""
    n = max(1, n_nodes)
    return int(4 * path_params * inner_steps * 2 * (n - 1) / n)


def _module_numel(announcements: list[ModuleAnnouncement]) -> int:
    """A module's size as its holders announce it: the median, so one peer's false figure moves nothing."""
    sizes = sorted(a.numel for a in announcements)
    return sizes[len(sizes) // 2] if sizes else 0


def _group_sizes(mid: str, metrics: list[NodeMetrics]) -> list[list[int]]:
    """[[round, members merged], …] of one module from its nodes' reports, oldest first (the largest report of a
    round: a member that got the result late saw the same group)."""
    by_round: dict[int, int] = {}
    for m in metrics:
        for module, r, size in m.groups:
            if module == mid:
                by_round[r] = max(by_round.get(r, 0), size)
    return [[r, n] for r, n in sorted(by_round.items())]


def counted_once(metrics: list[NodeMetrics]) -> list[NodeMetrics]:
    """One record per node: a node restarted under a new peer id continues its counts (the same counters_id) while
    its old record lives out its TTL; the record with the most tokens trained is its latest. A peer that names
    another's id can only put its own, larger, count in place of that node's: a total never drops by it."""
    latest: dict[str, NodeMetrics] = {}
    for m in metrics:
        key = m.counters_id or m.peer_id
        if key not in latest or m.tokens_trained > latest[key].tokens_trained:
            latest[key] = m
    return list(latest.values())


BEHIND_ROUNDS = 3
"""A holder whose announced round is this many rounds or more behind the module's newest is reported behind."""


def holders_left_behind(mid: str, announcements: list[ModuleAnnouncement], metrics: list[NodeMetrics]) -> dict:
    """Who of a module's holders does not keep up: `behind` (peer → rounds behind the newest announced round, for
    BEHIND_ROUNDS or more), `stalled` (peer → its rounds since one of the module's rounds last merged its outer
    gradient, as its metrics report: a holder refused by its group, told "behind" / "out of sync", or late round
    after round), and the module's
    healed splits from the metrics: `splits_healed` (how many the metrics name) and `settle_rounds_max` (the most
    rounds one of them took)."""
    newest = max((a.round for a in announcements), default=0)
    latest: dict[str, int] = {}
    for a in announcements:
        latest[a.peer_id] = max(latest.get(a.peer_id, 0), a.round)
    heals = [n for m in metrics for module, _, n in m.splits if module == mid]
    return {
        "behind": {p: newest - r for p, r in sorted(latest.items()) if newest - r >= BEHIND_ROUNDS},
        "stalled": {m.peer_id: n for m in sorted(metrics, key=lambda m: m.peer_id) for module, n in m.stalled
                    if module == mid},
        "splits_healed": len(heals),
        "settle_rounds_max": max(heals, default=0),
    }


def summarize(spec: SwarmSpec, view: SwarmView) -> dict:
    metrics = {m.peer_id: m for m in view.metrics}
    numel = {mid: _module_numel(view.modules.get(mid, [])) for mid in spec.all_module_ids()}
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
        missed = [entry for m in view.metrics for entry in m.rounds_missed if entry[0] == mid]
        modules.append({
            "module": mid,
            "round": newest,
            "holders": len({a.peer_id for a in anns}),
            "holders_at_round": sum(1 for a in anns if a.round == newest),
            "holder_ids": sorted({a.peer_id for a in anns}),
            "numel": numel[mid],
            "group_sizes": _group_sizes(mid, view.metrics),
            "rounds_late": sum(e[1] for e in missed),
            "rounds_failed": sum(e[2] for e in missed),
            **agreement,
            **holders_left_behind(mid, anns, view.metrics),
        })
    nodes = len({c.peer_id for c in view.claims})
    ddp = sum(ddp_fp32_bytes(sum(numel[mid] for mid in spec.module_ids(m.path)), m.inner_steps, len(view.metrics))
              for m in view.metrics)
    sent = sum(m.bytes_sent for m in view.metrics)
    return {
        "swarm_id": spec.swarm_id,
        "name": spec.name,
        "paths": paths,
        "modules": modules,
        "totals": {
            "nodes": nodes,
            "paths_served": sum(1 for p in paths if p["nodes"]),
            "tokens_per_s": sum(m.tokens_per_s for m in view.metrics),
            "tokens_trained": sum(m.tokens_trained for m in counted_once(view.metrics)),
            "bytes_sent": sent,
            "bytes_received": sum(m.bytes_received for m in view.metrics),
            "ddp_fp32_bytes": ddp,
            "bytes_vs_ddp": (ddp / sent) if sent else None,
            "nodes_reporting": len(view.metrics),
            "nodes_reachable": sum(1 for m in view.metrics if m.reachable is True),
            "nodes_behind_nat": sum(1 for m in view.metrics if m.reachable is False),
            "splits_healed": sum(m.splits_healed for m in view.metrics),
            "holders_left_behind": sum(len(m["behind"]) + len(set(m["stalled"]) - set(m["behind"])) for m in modules),
        },
    }
