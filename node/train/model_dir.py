"""A whole model on disk: every module of a swarm in one checkpoint, with the swarm's spec (and so its router) beside.

    DIR/spec.toml                  the spec: architecture, router, data; `eval` and `generate` need no --spec
    DIR/LATEST, DIR/round-NNNNNN/  a checkpoint (node/train/checkpoint.py) of every module, each at its own outer
                                   round (modules advance independently); the round directory is named after the
                                   newest, and its manifest's `provenance` says where each module came from

`pathswarm model pull` (node/peer/pull.py) and `pathswarm model assemble` (node/train/assemble.py) write one; a node's
own checkpoint is a directory of the same format that holds its path's modules only and no spec.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pathswarm.jsonfile import write_text_atomic
from pathswarm.node.train.checkpoint import CheckpointError, ModuleState, save_checkpoint
from pathswarm.protocol.spec import SwarmSpec, load_spec

SPEC_FILE = "spec.toml"


def spec_beside(checkpoint: str | Path) -> Path | None:
    """The spec.toml of a whole-model directory, given the directory or one of its round directories."""
    p = Path(checkpoint)
    if (p / SPEC_FILE).is_file():
        return p / SPEC_FILE
    is_round = (p / "manifest.json").is_file()
    return p.parent / SPEC_FILE if is_round and (p.parent / SPEC_FILE).is_file() else None


def resolve_spec(checkpoint: str | Path, spec_path: str | None) -> SwarmSpec:
    """`--spec` when given, else the spec stored beside a whole model (a node's checkpoint has none)."""
    if spec_path:
        return load_spec(spec_path)
    found = spec_beside(checkpoint)
    if found is None:
        if not Path(checkpoint).exists():
            raise CheckpointError(f"{checkpoint}: checkpoint directory not found")
        raise CheckpointError(f"{checkpoint} holds no {SPEC_FILE} (a node's checkpoint has none; a model from "
                              "`pathswarm model pull` or `model assemble` has): pass --spec SPEC.toml")
    return load_spec(found)


def write_model(out_dir: str | Path, spec: SwarmSpec, modules: dict[str, ModuleState],
                provenance: dict[str, Any]) -> Path:
    """Write a whole model (every module of the spec) and its spec; returns the round directory. The checkpoint is
    written atomically first (an interrupted write leaves the previous model, if any, readable), then the spec."""
    missing = [mid for mid in spec.all_module_ids() if mid not in modules]
    if missing:
        raise CheckpointError(f"a whole model needs every module; missing {', '.join(missing)}")
    out = Path(out_dir)
    round_dir = save_checkpoint(out, spec, max(st.round for st in modules.values()), modules, provenance=provenance)
    write_text_atomic(out / SPEC_FILE, spec.to_toml(), durable=True)
    return round_dir
