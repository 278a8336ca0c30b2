"""What every benchmark shares: its command line (--json, --plot, --replot), the machine it ran on,
writing its results and figure; and, for the networked ones, a spec on the default corpus with a chosen H."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import torch

from pathswarm.jsonfile import write_json_atomic
from pathswarm.node.app.fmt import write_figure
from pathswarm.node.app.swarm_init import init_spec
from pathswarm.node.model.data import load_documents
from pathswarm.protocol.spec import AveragingSpec, CodecSpec, InnerOptSpec, SwarmSpec

# The harnesses the unit tests share with the benchmarks live in tests/ (tests/fuzzing.py, tests/attacks.py):
# the repository root goes on the path, last (its pathswarm/ folder must not shadow the installed package),
# so that `from tests.… import …` works in a benchmark that imports this module first.
REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

RESULTS = Path(__file__).parent / "results"
"""Where the committed results and figures live."""


def arguments(doc: str, name: str = "", plot: bool = False, replot: bool = False) -> argparse.ArgumentParser:
    """A benchmark's command line, its module docstring as --help. With `name`: --json (default
    results/NAME.json); with `plot`: --plot (results/NAME.png); with `replot`: --replot."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if name:
        ap.add_argument("--json", default=str(RESULTS / f"{name}.json"), help="write the results here")
    if plot:
        ap.add_argument("--plot", default=str(RESULTS / f"{name}.png"), help="draw the figure here")
    if replot:
        ap.add_argument("--replot", action="store_true", help="only redraw --plot from the results in --json")
    return ap


def write_spec(directory: Path, inner_steps: int, name: str = "bench", grace_s: float = 30.0,
               codec: CodecSpec | None = None) -> tuple[SwarmSpec, Path]:
    base = SwarmSpec(name=name, inner=InnerOptSpec(steps=inner_steps), codec=codec or CodecSpec(),
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


def read_json(path: str) -> dict:
    """Results written by an earlier run (--replot)."""
    return json.loads(Path(path).read_text())


def save_plot(fig, path: str | Path) -> None:
    """Write a benchmark's figure (PNG, 120 dpi) and say so."""
    write_figure(fig, path, dpi=120)
    print(f"wrote {path}")
