"""Reference quantiser: the same rule as `quantize.py`, written plainly in float64 over the whole tensor.

No chunks, no preallocated buffers, no reciprocal: tests compare the fast path against this. The two
agree except where float32 and float64 round differently: a scale one bfloat16 step apart when a
block's step lands next to a bfloat16 boundary, and int8 values one apart at exact rounding ties.
"""

from __future__ import annotations

import math

import torch

from pathswarm.compression.quantize import BLOCK_ERROR_CAP, QMAX, TINY, round_up_to_bf16_


def bf16_ceil(values: torch.Tensor) -> torch.Tensor:
    """Smallest bfloat16 value >= each non-negative float64 value, as float64."""
    as_f32 = values.float()
    below = as_f32.double() < values
    as_f32[below] = torch.nextafter(as_f32[below], torch.tensor(math.inf))
    return round_up_to_bf16_(as_f32).double()


def quantize_reference(x: torch.Tensor, block_size: int, target_error: float,
                       scale_max: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 of x.numel() values, scales float32 holding bfloat16 values), computed in float64."""
    flat = x.detach().reshape(-1).double()
    n = flat.numel()
    n_blocks = -(-n // block_size)
    blocks = torch.zeros(n_blocks * block_size, dtype=torch.float64)
    blocks[:n] = flat
    blocks = blocks.view(n_blocks, block_size)
    counts = torch.full((n_blocks,), float(block_size), dtype=torch.float64)
    if n_blocks:
        counts[-1] = n - (n_blocks - 1) * block_size
    absmax = blocks.abs().amax(dim=1)
    block_rms = (blocks.square().sum(dim=1) / counts).sqrt()
    tensor_rms = flat.square().mean().sqrt() if n else flat.new_zeros(())
    floor = math.sqrt(12) * torch.minimum(target_error * tensor_rms, BLOCK_ERROR_CAP * block_rms)
    step = torch.maximum(absmax / QMAX, floor)
    scales = bf16_ceil(step).clamp(TINY, scale_max)
    q = torch.round(blocks / scales[:, None]).clamp(-QMAX, QMAX).to(torch.int8)
    return q.reshape(-1)[:n], scales.float()


def dequantize_reference(q: torch.Tensor, scales: torch.Tensor, block_size: int,
                         dtype: torch.dtype) -> torch.Tensor:
    """1-D tensor of `dtype`: q[i] * scales[i // block_size], computed in float64."""
    per_value = scales.double().repeat_interleave(block_size)[:q.numel()]
    return (q.double() * per_value).to(dtype)
