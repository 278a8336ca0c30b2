"""Shared fixtures: small specs with a router, and a fast synthetic corpus."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

# Two cores: keep torch from oversubscribing them when pytest runs.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def tiny_spec(**model_overrides):
    """A small 2x2 spec with a fitted router on the synthetic corpus (cached per argument set)."""
    from pathswarm.node.app.swarm_init import init_spec
    from pathswarm.node.model.data import synthetic_corpus
    from pathswarm.protocol.spec import DataSpec, InnerOptSpec, ModelSpec, SwarmSpec

    model = dict(width=32, base_width=32, n_heads=2, layers_per_module=1, context_len=32)
    model.update(model_overrides)
    base = SwarmSpec(name="test", model=ModelSpec(**model), inner=InnerOptSpec(steps=5, batch_size=4, warmup_steps=2),
                     data=DataSpec(corpus="synthetic"))
    return init_spec(base, synthetic_corpus(200, seed=0))


@pytest.fixture(scope="session")
def spec():
    return tiny_spec()


@pytest.fixture(scope="session")
def synthetic_docs():
    from pathswarm.node.model.data import synthetic_corpus

    return synthetic_corpus(200, seed=0)


# ---- helpers of the end-to-end tests (real CLI processes) ------------------------------------------
def wait_until(predicate, timeout_s: float, what: str):
    """Poll predicate() until it is truthy (processes report through files: no event to wait on)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def tokens_add_up(st: dict | None) -> dict | None:
    """`st` (a node's status file, None: not written yet), once checked: every status file, mid-chunk, just before a
    kill or after a restart, holds trained = merged + unmerged + discarded + lost (node/peer/counters.py)."""
    if st:
        parts = [st[k] for k in ("tokens_merged", "tokens_unmerged", "tokens_discarded", "tokens_lost")]
        assert st["tokens_trained"] == sum(parts), {k: v for k, v in st.items() if k.startswith("tokens_")}
        assert min(parts) >= 0, {k: v for k, v in st.items() if k.startswith("tokens_")}
    return st


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `pathswarm ARGS…` to completion."""
    return subprocess.run([sys.executable, "-m", "pathswarm", *args], capture_output=True, text=True, timeout=timeout)


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The one `error:` line of a user-facing failure (exit 2, no traceback)."""
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    [line] = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    return line
