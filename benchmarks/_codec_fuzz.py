"""benchmarks/codec.py's fuzz run: mutated codec frames decoded in worker processes, outcomes counted (any exception
other than CodecError, any hang, is a failure). Frames and mutations: tests/fuzzing.py, as the unit tests use."""

from __future__ import annotations

import multiprocessing
import random
import re
import time
from collections import Counter

import _swarm_common  # noqa: F401 - puts the repository on sys.path, for tests.fuzzing
import torch

from pathswarm.compression import CodecError, decode
from tests.fuzzing import FRAME_MAX_ELEMENTS, FRAMES, mutate_frame

HANG_SECONDS = 1.0


def error_kind(message: str) -> str:
    """A CodecError message without its particulars: 'frame truncated: 36 bytes, …' -> 'frame truncated'."""
    return re.split(r"[\d'\"(\[]", message, maxsplit=1)[0].strip(" :,").removesuffix(" b") or message[:30]


def _fuzz_worker(args: tuple[int, int]) -> dict:
    seed, count = args
    torch.set_num_threads(1)
    rng = random.Random(seed)
    outcomes, others = Counter(), Counter()
    slowest = 0.0
    for _ in range(count):
        data = mutate_frame(rng.choice(FRAMES), rng)
        start = time.perf_counter()
        try:
            y = decode(data, max_elements=FRAME_MAX_ELEMENTS)
            outcomes["decoded"] += 1
            if not bool(torch.isfinite(y).all()):
                outcomes["decoded_non_finite"] += 1
        except CodecError as e:
            outcomes["codec_error"] += 1
            outcomes["codec_error: " + error_kind(str(e))] += 1
        except Exception as e:  # noqa: BLE001 - the point of the fuzz run is to count these
            others[f"{type(e).__name__}: {str(e)[:120]}"] += 1
        elapsed = time.perf_counter() - start
        slowest = max(slowest, elapsed)
        if elapsed > HANG_SECONDS:
            outcomes["slow_decodes"] += 1
    return dict(outcomes=dict(outcomes), others=dict(others), slowest_s=slowest)


def fuzz(frames: int, workers: int, seed: int) -> dict:
    shares = [frames // workers + (i < frames % workers) for i in range(workers)]
    start = time.perf_counter()
    # Fresh interpreters: a fork of this process (which has run OpenMP and zstd thread pools) can deadlock.
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(workers) as pool:
        pending = pool.map_async(_fuzz_worker, [(seed + i, share) for i, share in enumerate(shares)])
        try:
            parts = pending.get(timeout=max(600.0, frames * 1e-3))
            hangs = 0
        except multiprocessing.TimeoutError:
            parts, hangs = [], workers
    outcomes, others = Counter(), Counter()
    for part in parts:
        outcomes.update(part["outcomes"])
        others.update(part["others"])
    by_message = {k.split(": ", 1)[1]: v for k, v in outcomes.most_common() if k.startswith("codec_error: ")}
    return dict(frames=frames, workers=workers, seconds=round(time.perf_counter() - start, 1),
                decoded=outcomes["decoded"], codec_errors=outcomes["codec_error"],
                other_exceptions=sum(others.values()), other_exception_kinds=dict(others),
                decoded_non_finite=outcomes["decoded_non_finite"], hangs=hangs,
                slow_decodes_over_1s=outcomes["slow_decodes"],
                slowest_decode_ms=round(1e3 * max((p["slowest_s"] for p in parts), default=0.0), 3),
                codec_errors_by_message_start=by_message)
