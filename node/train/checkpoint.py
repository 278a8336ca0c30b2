"""Checkpoints: one safetensors file per module plus a JSON manifest, written atomically.

Layout under a checkpoint root:

    ROOT/round-000012/manifest.json      swarm_id, round, module ids, file hashes, replica digests, the saving
                                         node's counters (node/peer/counters.py: a restart continues them)
    ROOT/round-000012/L0M1.safetensors   the module's weights by name + its outer momentum
    ROOT/LATEST                          name of the newest complete round directory

A round directory is written under a temporary name, every file fsync'ed and hashed from the disk into the
manifest, then renamed into place, its files checked there, and only then LATEST replaced (the same way) and older
rounds pruned: a kill at any moment, or a round that is not in place as written, leaves the previous complete round
readable and named.
Loading checks the manifest against the spec (swarm id, module ids, shapes) and the file hashes, and fails with a
`CheckpointError` that says what is wrong. Loaded by its root, a damaged newest round (a truncated or missing file,
a bad manifest, LATEST naming a round that is not there) falls back to the newest intact one, with a WARN that names
the bad file; a round directory named by the caller is loaded as it is.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from pathswarm.jsonfile import fsync_dir, write_json_atomic, write_text_atomic
from pathswarm.node.model.model import new_module
from pathswarm.protocol.rounds.outer import state_digest
from pathswarm.protocol.spec import SwarmSpec

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
MOMENTUM_KEY = "__outer_momentum__"
FEEDBACK_KEY = "__error_feedback__"
"""The saving node's error-feedback residual of the module (what its frames have not carried yet: with SparseLoCo
most of its unsent outer gradient), when it has one. Local to the node: not in the state's digest."""
KEEP_ROUNDS = 2
MAX_REDUCERS = 64  # reducer candidates a checkpoint or a peer may name (protocol/rounds/ bounds them too)


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, corrupt or belongs to another swarm."""


class CorruptCheckpointError(CheckpointError):
    """A round's files are damaged: a file missing, truncated or changed, or its manifest unreadable or malformed.
    (Not a spec mismatch, which every round of the same checkpoint shares.)"""


@dataclass
class ModuleState:
    """A module's weights (by parameter name), its flat outer momentum, and its outer round."""

    weights: dict[str, torch.Tensor]
    momentum: torch.Tensor
    round: int
    reducers: tuple[str, ...] = ()
    """Who reduces the next round, in failover order (see OuterState.reducers)."""
    feedback: torch.Tensor | None = None
    """This node's error-feedback residual of the module (flat fp32), or None (none yet, or a peer's state)."""

    def flat_weights(self) -> torch.Tensor:
        return torch.cat([self.weights[k].reshape(-1).float() for k in self.weights])


@dataclass
class Checkpoint:
    swarm_id: str
    round: int
    modules: dict[str, ModuleState]
    directory: Path
    counters: dict[str, Any] | None = None
    """The saving node's token counters as it wrote them, unchecked (node/peer/counters.py reads them); None: none
    saved (a checkpoint of `swarm init`, of the simulator, or of an older version)."""
    provenance: dict[str, Any] | None = None
    """Where a whole model's modules came from (node/train/model_dir.py: `model pull`, `model assemble`), as
    written; None in a node's own checkpoints."""


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def module_digest(state: ModuleState) -> str:
    """Same digest as `OuterState.digest` for the same anchor, momentum and round."""
    return state_digest(state.flat_weights(), state.momentum, state.round)


def owned(t: torch.Tensor) -> torch.Tensor:
    """`t` as a contiguous CPU tensor that owns its storage: a copy only when it is not one already (safetensors
    refuses tensors that share memory when they overlap). At 25M parameters a needless copy costs a third of a save;
    at 1B, gigabytes held while a round is written."""
    t = t.detach().to("cpu").contiguous()
    whole = t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size()
    return t if whole else t.clone()


def save_checkpoint(root: str | Path, spec: SwarmSpec, round_: int, modules: dict[str, ModuleState],
                    counters: dict[str, Any] | None = None, provenance: dict[str, Any] | None = None) -> Path:
    """Write a complete round atomically and point LATEST at it; returns the round directory. `counters`: the node's
    token counters, `provenance`: where a whole model's modules came from; each kept in the manifest as given (a
    JSON object)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    name = f"round-{round_:06d}"
    final = root / name
    tmp = root / f".{name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        return _write_round(root, spec, round_, modules, name, final, tmp, counters, provenance)
    except OSError:
        # A full disk (or any write error): the half-written round goes, LATEST still names the last complete one.
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_round(root: Path, spec: SwarmSpec, round_: int, modules: dict[str, ModuleState], name: str, final: Path,
                 tmp: Path, counters: dict[str, Any] | None, provenance: dict[str, Any] | None) -> Path:
    tmp.mkdir()
    manifest: dict[str, Any] = {"format": FORMAT_VERSION, "swarm_id": spec.swarm_id, "round": round_, "modules": {}}
    if counters is not None:
        manifest["counters"] = counters
    if provenance is not None:
        manifest["provenance"] = provenance
    sizes: dict[str, int] = {}
    for mid, st in sorted(modules.items()):
        # The states are the caller's and never change (PathWorker.module_state: the weights are copies of their own,
        # the momentum an OuterState's, which a round replaces and never modifies): nothing is copied again here.
        tensors = {k: owned(v) for k, v in st.weights.items()}
        tensors[MOMENTUM_KEY] = owned(st.momentum.float())
        if st.feedback is not None:
            tensors[FEEDBACK_KEY] = owned(st.feedback.float().reshape(-1))
        path = tmp / f"{mid}.safetensors"
        save_file(tensors, str(path), metadata={"module": mid, "round": str(st.round)})
        with open(path, "rb+") as f:
            os.fsync(f.fileno())
        sizes[path.name] = path.stat().st_size
        manifest["modules"][mid] = {"file": path.name, "sha256": _sha256_file(path), "round": st.round,
                                    "digest": module_digest(st), "reducers": list(st.reducers)}
    write_json_atomic(tmp / "manifest.json", manifest, sort_keys=True, durable=True)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_dir(root)
    try:
        _verify_round(final, sizes)
    except CorruptCheckpointError as e:  # LATEST still names the last round that read back; nothing is pruned
        shutil.rmtree(final, ignore_errors=True)
        raise OSError(f"the round just written does not read back: {e}") from None
    write_text_atomic(root / "LATEST", name + "\n", durable=True)
    _prune(root, keep=KEEP_ROUNDS, current=final)
    return final


def _verify_round(d: Path, sizes: dict[str, int]) -> None:
    """Every module file of a round in place at the size written, before LATEST names it and older rounds go. Its
    content was read back already: the manifest's hash is taken from the file after its fsync. Hashing it again here
    read every checkpoint twice, each round, on the training thread (~0.3 s more a round at 25 M parameters)."""
    for name, size in sizes.items():
        path = d / name
        if not path.is_file() or path.stat().st_size != size:
            raise CorruptCheckpointError(f"{path}: missing or not as written")


def complete_rounds(root: Path) -> list[Path]:
    """Round directories with a manifest, oldest written first. By write time, not by name: a node that re-synced
    to an older round (a healed split) writes a lower round number after a higher one."""
    found = []
    for p in root.iterdir():
        manifest = p / "manifest.json"
        if p.is_dir() and p.name.startswith("round-") and manifest.is_file():
            found.append((manifest.stat().st_mtime_ns, p.name, p))
    return [p for _, _, p in sorted(found)]


def _prune(root: Path, keep: int, current: Path) -> None:
    """Keep the round just written and the keep − 1 written before it."""
    older = [p for p in complete_rounds(root) if p != current]
    for old in older[:max(0, len(older) - (keep - 1))]:
        shutil.rmtree(old, ignore_errors=True)


def resolve_checkpoint_dir(path: str | Path) -> Path:
    """A round directory itself, or a root whose LATEST names one."""
    p = Path(path)
    if (p / "manifest.json").is_file():
        return p
    latest = p / "LATEST"
    if latest.is_file():
        target = p / latest.read_text(encoding="utf-8").strip()
        if (target / "manifest.json").is_file():
            return target
        fallback = complete_rounds(p)
        if fallback:
            logger.warning("%s: LATEST names %s, which is not a complete round; using %s, the newest that is",
                           p, target.name, fallback[-1].name)
            return fallback[-1]
        raise CheckpointError(f"{p}: LATEST names {target.name}, which has no manifest.json")
    if not p.exists():
        raise CheckpointError(f"{p}: checkpoint directory not found")
    if p.is_dir() and (rounds := complete_rounds(p)):
        logger.warning("%s: no LATEST file; using %s, the newest complete round", p, rounds[-1].name)
        return rounds[-1]
    raise CheckpointError(f"{p}: no manifest.json and no LATEST file; not a pathswarm checkpoint")


def modules_held(path: str | Path) -> set[str]:
    """The module ids the newest round of a checkpoint names (its manifest's; the files are not checked). A damaged
    manifest names none: `load_checkpoint` then says what is wrong, or falls back to an older round."""
    try:
        entries = read_manifest(resolve_checkpoint_dir(path)).get("modules")
    except CorruptCheckpointError:
        return set()
    return set(entries) if isinstance(entries, dict) else set()


def load_checkpoint(path: str | Path, spec: SwarmSpec, module_ids: list[str] | None = None) -> Checkpoint:
    """Load and validate a checkpoint against the spec (all its modules, or only `module_ids`). A root whose newest
    round is damaged gives the newest intact round instead (a WARN names the damage); a round directory is loaded as
    it is. Raises the newest round's error when no round is intact."""
    root = Path(path)
    first = resolve_checkpoint_dir(root)
    if first == root:
        return load_round(first, spec, module_ids)
    damaged: list[CorruptCheckpointError] = []
    for d in [first, *[r for r in reversed(complete_rounds(root)) if r != first]]:
        try:
            ckpt = load_round(d, spec, module_ids)
        except CorruptCheckpointError as e:
            damaged.append(e)
            continue
        if damaged:
            logger.warning("%s; using %s, the newest intact round", "; ".join(map(str, damaged)), d.name)
        return ckpt
    raise damaged[0]


def read_manifest(d: Path) -> dict[str, Any]:
    """A round directory's manifest, its format checked (CorruptCheckpointError if unreadable or of another one)."""
    try:
        manifest = json.loads((d / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CorruptCheckpointError(f"{d}/manifest.json: unreadable ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_VERSION:
        raise CorruptCheckpointError(f"{d}/manifest.json: unsupported format "
                                     f"{manifest.get('format') if isinstance(manifest, dict) else manifest!r}")
    return manifest


def load_round(d: Path, spec: SwarmSpec, module_ids: list[str] | None = None) -> Checkpoint:
    """One round directory as it is (no fallback to another round): every file checked."""
    manifest = read_manifest(d)
    if manifest.get("swarm_id") != spec.swarm_id:
        raise CheckpointError(f"{d}: checkpoint belongs to swarm {str(manifest.get('swarm_id'))[:12]}…, "
                              f"but the spec's swarm id is {spec.swarm_id[:12]}…")
    entries = manifest.get("modules")
    if not isinstance(entries, dict) or not all(isinstance(e, dict) for e in entries.values()):
        raise CorruptCheckpointError(f"{d}/manifest.json: 'modules' must be a table of tables")
    wanted = module_ids if module_ids is not None else sorted(entries)
    modules: dict[str, ModuleState] = {}
    for mid in wanted:
        if mid not in spec.all_module_ids():
            raise CheckpointError(f"{d}: module {mid!r} is not part of this swarm")
        if mid not in entries:
            raise CheckpointError(f"{d}: module {mid} is missing from the checkpoint")
        modules[mid] = _load_module(d, spec, mid, entries[mid])
    counters, provenance = manifest.get("counters"), manifest.get("provenance")
    return Checkpoint(swarm_id=spec.swarm_id, round=int(manifest.get("round", 0)), modules=modules, directory=d,
                      counters=counters if isinstance(counters, dict) else None,
                      provenance=provenance if isinstance(provenance, dict) else None)


def _load_module(d: Path, spec: SwarmSpec, mid: str, entry: dict) -> ModuleState:
    path = d / str(entry.get("file", ""))
    if not path.is_file() or path.parent != d:
        raise CorruptCheckpointError(f"{d}: module {mid}'s file {entry.get('file')!r} is missing")
    if _sha256_file(path) != entry.get("sha256"):
        raise CorruptCheckpointError(f"{path}: file hash does not match the manifest (corrupt or modified)")
    try:
        tensors = load_file(str(path))
    except Exception as e:  # safetensors raises several types for a damaged file
        raise CorruptCheckpointError(f"{path}: unreadable ({e})") from None
    momentum = tensors.pop(MOMENTUM_KEY, None)
    feedback = tensors.pop(FEEDBACK_KEY, None)
    expected = new_module(spec, mid).state_dict()
    if set(tensors) != set(expected):
        raise CheckpointError(f"{path}: parameter names differ from the spec's module {mid}")
    for k, v in expected.items():
        if tuple(tensors[k].shape) != tuple(v.shape):
            raise CheckpointError(f"{path}: {k} has shape {tuple(tensors[k].shape)}, spec says {tuple(v.shape)}")
    # Keep the module's own parameter order: flat vectors are built in that order.
    weights = {k: tensors[k] for k in expected}
    numel = sum(v.numel() for v in weights.values())
    if momentum is None or momentum.numel() != numel:
        raise CorruptCheckpointError(f"{path}: outer momentum missing or of the wrong size")
    if feedback is not None and (feedback.numel() != numel or not torch.isfinite(feedback).all()):
        raise CorruptCheckpointError(f"{path}: error-feedback residual of the wrong size or not finite")
    reducers = entry.get("reducers", [])
    if not (isinstance(reducers, list) and len(reducers) <= MAX_REDUCERS
            and all(isinstance(p, str) and 0 < len(p) <= 128 for p in reducers)):
        raise CorruptCheckpointError(f"{d}/manifest.json: module {mid}'s reducers must be a list of peer ids")
    return ModuleState(weights=weights, momentum=momentum.reshape(-1), round=int(entry.get("round", 0)),
                       reducers=tuple(reducers), feedback=None if feedback is None else feedback.reshape(-1).float())
