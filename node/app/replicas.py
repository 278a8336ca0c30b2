"""The replica check over nodes' status files: one version of each (module, round) in the whole swarm.

Every node records, per module, the digest of its state after each outer round it applied (`history` in
its status JSON) and who contributed to that round as it saw it (`groups`). The invariant is that every
node's digest for a (module, round) is the same, whatever group each node merged in: a round merged in two
versions (two reducers, each with part of the holders) is a split, and is reported with the nodes and
groups of each version. A node with no entry for a round (it joined later, or the round failed for it) is
simply not compared. Pure functions over plain dicts; used by the demo, the end-to-end tests and the chaos
benchmark.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Version:
    """One digest of a (module, round) and the nodes that hold it."""

    digest: str
    nodes: tuple[str, ...]
    """The nodes whose state after the round has this digest, in input order."""
    groups: tuple[tuple[str, ...], ...]
    """The contributors of the round as each of `nodes` recorded them (sorted; empty if it recorded none)."""


@dataclass(frozen=True)
class Split:
    """A (module, round) that nodes ended with different digests."""

    module: str
    round: str
    versions: tuple[Version, ...]
    """Two or more, in order of first appearance."""

    def __str__(self) -> str:
        parts = []
        for v in self.versions:
            groups = sorted({tuple(_short(p) for p in g) for g in v.groups})
            parts.append(f"{v.digest[:12]} on {', '.join(v.nodes)} (group{'s' if len(groups) > 1 else ''} "
                         f"{'; '.join('[' + ' '.join(g) + ']' for g in groups)})")
        return f"{self.module} round {self.round} in {len(self.versions)} versions: " + " vs ".join(parts)


@dataclass(frozen=True)
class ReplicaCheck:
    splits: tuple[Split, ...] = ()
    """The (module, round)s with two or more digests, by module then round."""
    digests_compared: int = 0
    """Digests of (module, round)s that two or more nodes recorded (each was compared with the others')."""
    rounds_compared: int = 0
    """(module, round)s that two or more nodes recorded."""
    nodes: tuple[str, ...] = field(default=())
    """The nodes' labels, in input order."""

    @property
    def split_rounds(self) -> int:
        return len(self.splits)

    @property
    def identical(self) -> bool:
        return not self.splits


def check_replicas(statuses: Mapping[str, dict | None] | Iterable[dict | None]) -> ReplicaCheck:
    """Compare every node's digest for each (module, round) with every other node's, whatever their groups.

    `statuses`: node name → status dict, or status dicts (each named by the end of its `peer_id`). Missing
    (None or empty) statuses are skipped. Round keys are compared as strings ("3" and 3 are one round)."""
    named = statuses.items() if isinstance(statuses, Mapping) else (
        (_short(str(st.get("peer_id") or f"node{i}")) if st else "", st) for i, st in enumerate(statuses))
    # (module, round) → digest → [(node, group)], dicts keeping first-appearance order
    seen: dict[tuple[str, str], dict[str, list[tuple[str, tuple[str, ...]]]]] = {}
    nodes = []
    for name, st in named:
        if not st:
            continue
        nodes.append(str(name))
        groups = st.get("groups") or {}
        for mid, rounds in (st.get("history") or {}).items():
            module_groups = groups.get(mid) or {}
            for r, digest in rounds.items():
                group = module_groups.get(str(r), module_groups.get(r, ()))
                seen.setdefault((str(mid), str(r)), {}).setdefault(str(digest), []).append(
                    (str(name), tuple(sorted(map(str, group)))))
    splits, digests_compared, rounds_compared = [], 0, 0
    for (mid, r), by_digest in sorted(seen.items(), key=lambda kv: (kv[0][0], _round_key(kv[0][1]))):
        held = sum(len(holders) for holders in by_digest.values())
        if held < 2:
            continue
        rounds_compared += 1
        digests_compared += held
        if len(by_digest) > 1:
            splits.append(Split(mid, r, tuple(
                Version(d, tuple(n for n, _ in holders), tuple(g for _, g in holders))
                for d, holders in by_digest.items())))
    return ReplicaCheck(tuple(splits), digests_compared, rounds_compared, tuple(nodes))


def replica_mismatches(statuses) -> tuple[list[str], int]:
    """The split (module, round)s, one line each naming every digest with its nodes and groups, and how many
    digests were compared (see `check_replicas`)."""
    check = check_replicas(statuses)
    return [str(s) for s in check.splits], check.digests_compared


def replicas_identical(statuses) -> tuple[bool, int]:
    """Did every node that recorded a (module, round) end it with the same digest? The verdict and how many
    digests were compared (see `check_replicas`)."""
    check = check_replicas(statuses)
    return check.identical, check.digests_compared


def _short(peer_id: str) -> str:
    return peer_id[-8:]


def _round_key(r: str) -> tuple[int, int | str]:
    return (0, int(r)) if r.lstrip("-").isdigit() else (1, r)
