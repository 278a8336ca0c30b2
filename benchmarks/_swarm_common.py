"""Shared set-up of the networked benchmarks: a spec on the default corpus with a chosen H."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import torch

from pathswarm.jsonfile import write_json_atomic
from pathswarm.node.app.swarm_init import init_spec
from pathswarm.node.model.data import load_documents
from pathswarm.protocol.spec import AveragingSpec, InnerOptSpec, SwarmSpec

# The harnesses the unit tests share with the benchmarks live in tests/ (tests/fuzzing.py, tests/attacks.py):
# the repository root goes on the path, last (its pathswarm/ folder must not shadow the installed package),
# so that `from tests.… import …` works in a benchmark that imports this module first.
REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))


def write_spec(directory: Path, inner_steps: int, name: str = "bench", grace_s: float = 30.0) -> tuple[SwarmSpec, Path]:
    base = SwarmSpec(name=name, inner=InnerOptSpec(steps=inner_steps),
                     averaging=AveragingSpec(grace_s=grace_s, timeout_s=120.0, claim_ttl_s=30.0))
    spec = init_spec(base, load_documents(base.data))
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"swarm-h{inner_steps}.toml"
    path.write_text(spec.to_toml())
    return spec, path


def machine() -> dict:
    """What a result was measured on: versions, torch's threads at the call, and the machine's cores."""
    return {"python": platform.python_version(), "torch": torch.__version__, "cpus": torch.get_num_threads(),
            "cores": os.cpu_count(), "platform": platform.platform()}


def write_json(path: str, payload: dict) -> None:
    write_json_atomic(path, payload)
    print(f"wrote {path}")
