"""Blockwise int8 quantisation kernels (the fast path): torch ops over cache-sized chunks, preallocated buffers.

The quantiser, chosen by measurement (benchmarks/codec.py): every block of `block_size` values gets
one scale s and its values become round(x / s) in [-127, 127], with

    s = max(absmax_block / 127, sqrt(12) * min(target_error * rms_tensor, BLOCK_ERROR_CAP * rms_block))

then rounded up to a bfloat16. absmax / 127 is plain absmax int8: it never clips, so heavy-tailed
blocks keep their outliers. The second term is a floor on the step. Rounding with step s leaves an
error of s / sqrt(12) RMS, and for a given total squared error the fewest bits go to a step that is the
same everywhere (reverse water-filling), so the floor comes from the whole tensor's rms: the tensor's
relative L2 error is about target_error, and blocks far quieter than the tensor get fewer levels
instead of the same relative precision (on real pseudo-gradients, whose block rms spans 30x, that is
15 % fewer bytes at the same error). BLOCK_ERROR_CAP bounds how coarse a quiet block may get, so no
block is rounded away entirely, with or without error feedback. Fewer levels in use means zstd's
entropy coder packs the int8 values into fewer bits. target_error = 0 gives plain absmax int8; the
decoder needs none of this, it multiplies by the stored scale.

bitsandbytes' blockwise kernels were measured here as the alternative: on CPU they run at a fraction
of these torch ops' speed, so they serve only as the benchmark's baseline. tests/unit/codec_reference.py is a plain
float64 implementation of the same rule that the tests compare this one to.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

QMAX = 127
TINY = torch.finfo(torch.float32).tiny
"""Smallest scale: keeps 1 / scale finite, so all-zero and denormal blocks need no special case."""
BLOCK_ERROR_CAP = 0.05
"""The step floor never exceeds what gives a block this relative error (see above)."""
CHUNK_ELEMENTS = 1 << 17
"""Values per chunk: the chunk and its fp32 work buffer (1 MiB) stay in a core's L2 cache."""


_NUMPY_TWIN = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: np.int16}


def empty_like_numpy(n: int, dtype: torch.dtype) -> torch.Tensor:
    """torch.empty(n, dtype=dtype), allocated through numpy: numpy asks the kernel for huge pages on
    large arrays (madvise), which halves the page-fault cost of a fresh 100 MB tensor (measured)."""
    return torch.from_numpy(np.empty(n, _NUMPY_TWIN[dtype])).view(dtype)


def round_up_to_bf16_(scales: torch.Tensor) -> torch.Tensor:
    """In place: each non-negative float32 becomes the smallest bfloat16 value >= it (bit arithmetic)."""
    bits = scales.view(torch.int32)
    bits.add_(0xFFFF).bitwise_and_(-0x10000)
    return scales


@functools.cache
def scale_limit(dtype: torch.dtype) -> float:
    """Largest bfloat16 scale s such that 128 * s is finite in `dtype`.

    The encoder clamps scales to it and the decoder rejects larger ones, so no int8 value (even -128,
    which the encoder never writes) can decode to Inf."""
    s = torch.tensor([torch.finfo(dtype).max / 128], dtype=torch.float32).to(torch.bfloat16)
    while not torch.isfinite((s.float() * 128).to(dtype)).all():
        s = (s.view(torch.int16) - 1).view(torch.bfloat16)
    return float(s)


def _chunks(n: int, block_size: int):
    """(start, length, blocks) of each chunk; chunks hold whole blocks, the last one may end mid-block."""
    step = max(1, CHUNK_ELEMENTS // block_size) * block_size
    for start in range(0, n, step):
        m = min(step, n - start)
        yield start, m, -(-m // block_size)


def _fp32_chunk(flat: torch.Tensor, start: int, m: int, mp: int, staged: torch.Tensor) -> torch.Tensor:
    """flat[start:start + m] as float32 padded with zeros to mp values (a view when no copy is needed);
    zeros change neither a block's absmax nor its sum of squares."""
    x = flat[start:start + m]
    if x.dtype == torch.float32 and m == mp:
        return x
    staged[:m].copy_(x)
    staged[m:mp].zero_()
    return staged[:mp]


def quantize(flat: torch.Tensor, block_size: int, target_error: float, scale_max: float,
             q_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise a 1-D contiguous CPU float tensor (fp32, fp16 or bf16).

    Returns q (int8, n_blocks * block_size values: the ones past numel are padding; written into
    q_out when given) and the scales (float32 holding bfloat16 values, one per block).
    Raises ValueError on NaN or Inf.

    Two passes over cache-sized chunks: the first collects each block's absmax and L2 norm, then all
    scales are computed at once (a few ops over n / block_size values instead of a dozen small ops per
    chunk, and the tensor's norm comes from the block norms instead of another pass over memory); the
    second divides, rounds and narrows to int8."""
    n = flat.numel()
    n_blocks = -(-n // block_size)
    q = torch.empty(n_blocks * block_size, dtype=torch.int8) if q_out is None else q_out
    if n == 0:
        return q, torch.empty(n_blocks, dtype=torch.float32)
    chunk = min(max(1, CHUNK_ELEMENTS // block_size) * block_size, n_blocks * block_size)
    work = torch.empty(chunk, dtype=torch.float32)  # |x|, then x / s
    staged = torch.empty(chunk, dtype=torch.float32)  # fp32 copy of half inputs and of the ragged last block
    absmax, norms = _block_stats(flat, block_size, target_error > 0, work, staged)
    top = float(absmax.max())
    if not math.isfinite(top):
        block = int((~torch.isfinite(absmax)).nonzero()[0])
        raise ValueError(f"tensor contains NaN or Inf (first in elements {block * block_size}.."
                         f"{min(n, (block + 1) * block_size) - 1}); refusing to encode it")
    scales = _block_scales(absmax, norms, n, block_size, target_error, scale_max)
    _round(flat, block_size, scales, top > QMAX * scale_max, q, work, staged)
    return q, scales


def _block_stats(flat: torch.Tensor, block_size: int, want_norms: bool, work: torch.Tensor,
                 staged: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The first pass: each block's absmax, and its L2 norm when want_norms (float32, one per block)."""
    n_blocks = -(-flat.numel() // block_size)
    absmax = torch.empty(n_blocks, dtype=torch.float32)
    norms = torch.empty(n_blocks, dtype=torch.float32) if want_norms else None
    for start, m, k in _chunks(flat.numel(), block_size):
        mp, b0 = k * block_size, start // block_size
        x = _fp32_chunk(flat, start, m, mp, staged)
        w = work[:mp]
        torch.abs(x, out=w)
        torch.amax(w.view(k, block_size), dim=1, out=absmax[b0:b0 + k])
        if norms is not None:
            torch.linalg.vector_norm(x.view(k, block_size), dim=1, out=norms[b0:b0 + k])
    return absmax, norms


def _block_scales(absmax: torch.Tensor, norms: torch.Tensor | None, n: int, block_size: int, target_error: float,
            scale_max: float) -> torch.Tensor:
    """Every block's scale (float32 holding bfloat16 values), from its stats; absmax and norms are overwritten."""
    n_blocks = absmax.numel()
    scales = torch.empty(n_blocks, dtype=torch.float32)
    torch.mul(absmax, 1.0 / QMAX, out=scales)
    if norms is not None:
        # floor = sqrt(12) * min(target_error * rms_tensor, BLOCK_ERROR_CAP * ||block|| / sqrt(count)); the
        # block term is also capped at sqrt(12) * BLOCK_ERROR_CAP * absmax (rms <= absmax), which only
        # matters when squares overflow float32 (an overflowed tensor rms is Inf and leaves the block term
        # in charge).
        tensor_rms = float(torch.linalg.vector_norm(norms)) / math.sqrt(n)
        floor_tensor = math.sqrt(12) * target_error * tensor_rms if math.isfinite(tensor_rms) else math.inf
        floor = norms.mul_(math.sqrt(12) * BLOCK_ERROR_CAP / math.sqrt(block_size))
        last = n - (n_blocks - 1) * block_size
        if last != block_size:  # the ragged block's rms is over its own values, not the padding
            floor[-1:].mul_(math.sqrt(block_size / last))
        torch.minimum(floor, absmax.mul_(math.sqrt(12) * BLOCK_ERROR_CAP), out=floor)
        floor.clamp_(max=floor_tensor)
        torch.maximum(scales, floor, out=scales)
    round_up_to_bf16_(scales).clamp_(TINY, scale_max)
    return scales


def _round(flat: torch.Tensor, block_size: int, scales: torch.Tensor, saturate: bool, q: torch.Tensor,
           work: torch.Tensor, staged: torch.Tensor) -> None:
    """The second pass: q = round(x / scale) per block, as int8 (padding past numel included)."""
    inv = torch.reciprocal(scales)
    for start, m, k in _chunks(flat.numel(), block_size):
        mp, b0 = k * block_size, start // block_size
        x = _fp32_chunk(flat, start, m, mp, staged)
        w = work[:mp]
        torch.mul(x.view(k, block_size), inv[b0:b0 + k, None], out=w.view(k, block_size))
        torch.round(w, out=w)
        if saturate:
            # Only near the dtype's largest finite values: the scale is capped, so values beyond
            # 127 * scale_max saturate at the largest representable magnitude instead of wrapping.
            w.clamp_(-QMAX, QMAX)
        q[start:start + mp].copy_(w)


def dequantize(values, scales: torch.Tensor, block_size: int, n: int, dtype: torch.dtype,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """values: n int8 values (any bytes-like, read in place); scales: float32, one per block.

    Returns a 1-D tensor of `dtype` (`out`, a contiguous 1-D tensor of n values, when given)."""
    out = empty_like_numpy(n, dtype) if out is None else out
    if n == 0:
        return out
    src = np.frombuffer(values, dtype=np.int8, count=n)
    chunk = min(max(1, CHUNK_ELEMENTS // block_size) * block_size, -(-n // block_size) * block_size)
    qbuf = torch.empty(chunk, dtype=torch.int8)
    qbuf_np = qbuf.numpy()
    staged = torch.empty(chunk, dtype=torch.float32)
    for start, m, k in _chunks(n, block_size):
        mp, b0 = k * block_size, start // block_size
        # Copying the chunk into a small writable buffer lets torch read it without wrapping the
        # (read-only) decompressed bytes, and the copy stays in cache for the next two ops.
        np.copyto(qbuf_np[:m], src[start:start + m])
        qbuf_np[m:mp] = 0
        direct = dtype == torch.float32 and m == mp
        y = out[start:start + m] if direct else staged[:mp]
        y.copy_(qbuf[:mp])
        y.view(k, block_size).mul_(scales[b0:b0 + k, None])
        if not direct:
            out[start:start + m].copy_(y[:m])
    return out
