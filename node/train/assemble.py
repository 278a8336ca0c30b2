"""`pathswarm model assemble`: one whole model out of node checkpoints on disk, module by module.

Each node's checkpoint holds its path's modules at the rounds it reached (and the round before: KEEP_ROUNDS). For
every module of the swarm the assembly takes the newest (round, digest) the checkpoints agree on:

- the newest round any checkpoint holds, when every checkpoint that holds that round holds the same state;
- when they hold different states at that round (a split the nodes had not healed when they stopped), the state a
  strict majority of them hold; with none, the next older round, and so on, each skipped round said in a note.

Where a state is held by several checkpoints, its file is read from the first given that reads back intact (file
hashes, shapes) and hashes to the digest its manifest names. A module no checkpoint holds is an error that names
the paths it belongs to: a whole model is every module. Pure file work: no networking.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pathswarm.node.train.checkpoint import (
    CheckpointError,
    CorruptCheckpointError,
    ModuleState,
    complete_rounds,
    load_round,
    module_digest,
    read_manifest,
    resolve_checkpoint_dir,
)
from pathswarm.protocol.spec import SwarmSpec, format_path

logger = logging.getLogger(__name__)

State = tuple[int, str]
"""(outer round, digest) of a module's state."""


@dataclass(frozen=True)
class Chosen:
    """What the assembly took for one module, and why."""

    module: str
    round: int
    digest: str
    source: Path
    """The round directory its file was read from."""
    held_by: tuple[str, ...]
    """The checkpoints (as given) that hold this state."""
    notes: tuple[str, ...] = ()
    """Newer rounds passed over (checkpoints disagreeing), said for the user."""


@dataclass
class Found:
    """Every state of every module the given checkpoints hold: module → state → [(checkpoint, round dir)]."""

    states: dict[str, dict[State, list[tuple[str, Path]]]] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    """counters_id → tokens trained, the newest each checkpoint's manifests say (a node's counts across its runs)."""


def choose_state(held: Mapping[State, Sequence[str]]) -> tuple[State | None, list[str]]:
    """The newest state the holders agree on (module docstring), and notes on the newer rounds passed over. `held`:
    state → the checkpoints holding it."""
    by_round: dict[int, dict[str, set[str]]] = {}
    for (round_, digest), roots in held.items():
        by_round.setdefault(round_, {}).setdefault(digest, set()).update(roots)
    notes: list[str] = []
    for round_ in sorted(by_round, reverse=True):
        versions = by_round[round_]
        holders = set().union(*versions.values())
        top = max(versions, key=lambda d: (len(versions[d]), d))
        if len(versions) == 1 or 2 * len(versions[top]) > len(holders):
            if len(versions) > 1:
                notes.append(f"round {round_}: {len(versions)} versions; took {top[:12]}, held by "
                             f"{len(versions[top])} of {len(holders)} checkpoints")
            return (round_, top), notes
        notes.append(f"round {round_}: the checkpoints hold {len(versions)} versions and none by a majority "
                     f"({', '.join(f'{d[:12]} x{len(r)}' for d, r in sorted(versions.items()))}); passed over")
    return None, notes


def scan(spec: SwarmSpec, checkpoints: Sequence[str | Path]) -> Found:
    """Read the manifests of every intact round of every checkpoint (a node's checkpoint root, a round directory
    or a whole model). A checkpoint of another swarm, or one with no readable round, is an error; a damaged round
    beside intact ones is skipped with a WARN."""
    found = Found()
    for given in checkpoints:
        root, name = Path(given), str(given)
        rounds = [root] if (root / "manifest.json").is_file() else complete_rounds(root) if root.is_dir() else []
        if not rounds:
            resolve_checkpoint_dir(root)  # raises the error that says what the directory lacks
        readable = 0
        for d in rounds:
            try:
                manifest = read_manifest(d)
            except CorruptCheckpointError as e:
                logger.warning("%s; skipped", e)
                continue
            if manifest.get("swarm_id") != spec.swarm_id:
                raise CheckpointError(f"{d}: checkpoint of swarm {str(manifest.get('swarm_id'))[:12]}…, but the "
                                      f"spec's swarm id is {spec.swarm_id[:12]}…")
            readable += 1
            entries = manifest.get("modules")
            for mid, entry in (entries.items() if isinstance(entries, dict) else ()):
                if mid in spec.all_module_ids() and isinstance(entry, dict) and isinstance(entry.get("digest"), str):
                    state = (int(entry.get("round", 0)), entry["digest"])
                    found.states.setdefault(mid, {}).setdefault(state, []).append((name, d))
            counters = manifest.get("counters")
            if isinstance(counters, dict) and isinstance(counters.get("counters_id"), str):
                trained = counters.get("trained", 0)
                if isinstance(trained, int) and trained >= found.counters.get(counters["counters_id"], 0):
                    found.counters[counters["counters_id"]] = trained
        if not readable:
            raise CheckpointError(f"{given}: no round of it reads back")
    return found


def assemble(spec: SwarmSpec,
             checkpoints: Sequence[str | Path]) -> tuple[dict[str, ModuleState], list[Chosen], int]:
    """Every module of the swarm from the given checkpoints (module docstring), what was chosen for each, and the
    tokens the checkpoints' nodes trained (their counters, each node once); CheckpointError names the modules no
    checkpoint holds (or holds intact), and the paths that need them."""
    found = scan(spec, checkpoints)
    modules: dict[str, ModuleState] = {}
    chosen: list[Chosen] = []
    problems: list[str] = []
    for mid in spec.all_module_ids():
        held = found.states.get(mid, {})
        state, notes = choose_state({s: [root for root, _ in where] for s, where in held.items()})
        if state is None:
            paths = [format_path(p) for p in spec.paths() if mid in spec.module_ids(p)]
            problems.append(f"{mid} (paths {', '.join(paths)}): " + ("; ".join(notes) if notes else
                                                                    "no checkpoint holds it"))
            continue
        loaded = _read_state(spec, mid, state, held[state])
        if loaded is None:
            problems.append(f"{mid}: no checkpoint holding round {state[0]} ({state[1][:12]}) reads back intact")
            continue
        modules[mid], source = loaded
        chosen.append(Chosen(mid, state[0], state[1], source, tuple(dict.fromkeys(r for r, _ in held[state])),
                             tuple(notes)))
    if problems:
        raise CheckpointError("cannot assemble a whole model: " + "; ".join(problems) +
                              ". Add the checkpoint of a node that served those paths")
    return modules, chosen, sum(found.counters.values())


def _read_state(spec: SwarmSpec, mid: str, state: State,
                where: Sequence[tuple[str, Path]]) -> tuple[ModuleState, Path] | None:
    for _, d in where:
        try:
            got = load_round(d, spec, [mid]).modules[mid]
        except CheckpointError as e:
            logger.warning("%s; trying another checkpoint that holds it", e)
            continue
        if (got.round, module_digest(got)) != state:
            logger.warning("%s: %s does not hash to the digest its manifest names; trying another checkpoint", d, mid)
            continue
        return got, d
    return None


def provenance(chosen: Sequence[Chosen], tokens_trained: int) -> dict:
    """What a whole model's manifest says of an assembly (node/train/model_dir.py): where each module came from."""
    return {"kind": "assemble", "assembled_at": int(time.time()), "tokens_trained": tokens_trained,
            "modules": {c.module: {"round": c.round, "digest": c.digest, "from": str(c.source),
                                   "held_by": list(c.held_by)} for c in chosen}}
