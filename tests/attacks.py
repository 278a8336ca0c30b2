"""Hostile outer gradients, for the test and the benchmark of robust aggregation (tests/unit/test_byzantine.py,
benchmarks/byzantine.py).

A `Tamper` for `run_simulation`: one worker (the attacker) replaces the frame it would send for every
module with one of these, built from its honest outer gradient Δ:

- `scaled`: 100 × Δ;   `sign_flip`: −Δ;   `noise`: Gaussian noise with Δ's norm;
- `nan`: a well-formed frame (right magic, sizes and checksum) whose scales are NaN, i.e. an all-NaN
  outer gradient (the codec's encoder refuses NaN, so a hostile peer has to forge the frame);
- `wrong_shape`: a valid frame of Δ with its last value cut off;
- `cycle`: the five above in turn, one per outer round.
"""

from __future__ import annotations

import torch

from pathswarm.compression import decode, encode
from pathswarm.compression.frame import CRC_BYTES, checksum, parse_frame

KINDS = ("scaled", "sign_flip", "noise", "nan", "wrong_shape")


def nan_frame(numel: int) -> bytes:
    """A frame that passes every structural check of the codec but whose scales are NaN."""
    frame = bytearray(encode(torch.zeros(numel)))
    parsed = parse_frame(bytes(frame), numel)
    start = parsed.header.scales_offset
    frame[start:start + 2 * parsed.header.n_blocks] = b"\xc0\x7f" * parsed.header.n_blocks  # bfloat16 NaN
    frame[-CRC_BYTES:] = checksum(memoryview(frame)[:-CRC_BYTES]).to_bytes(CRC_BYTES, "little")
    return bytes(frame)


def hostile_frame(kind: str, honest: bytes, numel: int, seed: int) -> bytes:
    delta = decode(honest, max_elements=numel).reshape(-1).float()
    if kind == "scaled":
        return encode(delta * 100)
    if kind == "sign_flip":
        return encode(-delta)
    if kind == "noise":
        noise = torch.randn(numel, generator=torch.Generator().manual_seed(seed))
        return encode(noise * (torch.linalg.vector_norm(delta) / torch.linalg.vector_norm(noise).clamp(min=1e-30)))
    if kind == "nan":
        return nan_frame(numel)
    if kind == "wrong_shape":
        return encode(delta[:-1])
    raise ValueError(f"unknown attack {kind!r} (one of {', '.join(KINDS)} or 'cycle')")


def attacker(kind: str, worker: int):
    """A Tamper: worker `worker` sends `kind` frames (`cycle`: the KINDS in turn, one per round)."""
    if kind != "cycle" and kind not in KINDS:
        raise ValueError(f"unknown attack {kind!r} (one of {', '.join(KINDS)} or 'cycle')")

    def tamper(index: int, module: str, round_: int, frame: bytes) -> bytes:
        if index != worker:
            return frame
        numel = parse_frame(frame, 1 << 40).header.numel
        this = KINDS[round_ % len(KINDS)] if kind == "cycle" else kind
        return hostile_frame(this, frame, numel, seed=round_)

    return tamper
