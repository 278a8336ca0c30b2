"""The int8 codec's encode / decode: a float tensor to one checked frame of blockwise int8 + zstd, and back.

encode: quantise into a reused int8 buffer (quantize.py) → zstd reads it in place and streams into a
reused frame buffer → header, scales and CRC around it (frame.py) → one copy out as `bytes`.
decode: parse and check every field (frame.py) → decompress exactly the declared number of bytes →
dequantise chunk by chunk into the output tensor (or `out`). decode raises only CodecError for bad
input, whatever the bytes.
"""

from __future__ import annotations

import os
import threading
from typing import IO, cast

import numpy as np
import torch
import zstandard

from pathswarm.compression.frame import (
    DTYPE_CODES,
    MAX_BLOCK_SIZE,
    MAX_NDIM,
    CodecError,
    FrameHeader,
    FrameWriter,
    parse_frame,
)
from pathswarm.compression.quantize import dequantize, quantize, scale_limit

DEFAULT_BLOCK_SIZE = 256
"""Values per scale: 2 scale bytes per 256 values cost 0.2 % of the fp32 size (swept in benchmarks/codec.py)."""
DEFAULT_ZSTD_LEVEL = 1
"""zstd level: higher levels gain nothing on quantised pseudo-gradients and cost speed (measured)."""
DEFAULT_TARGET_ERROR = 0.013
"""Relative L2 error the quantisation step aims at over the tensor (see quantize.py); 0 = plain absmax
int8. 1.3 % keeps a round under the 1.5 % bound on Gaussian and heavy-tailed data, and takes the
project's pseudo-gradients to about 0.17 of their fp32 size (plain absmax: 0.24; benchmarks/codec.py)."""
DEFAULT_MAX_ELEMENTS = 1 << 28
"""decode refuses frames declaring more values than this (1 GiB of fp32) unless told otherwise."""

_local = threading.local()


def _thread_state() -> threading.local:
    """Per-thread zstd contexts and buffers, reused across calls (a fresh 100 MB buffer costs more in
    page faults than quantising into it). Rebuilt after a fork: zstd's worker threads do not survive one."""
    if getattr(_local, "pid", None) != os.getpid():
        _local.pid, _local.compressors, _local.decompressor = os.getpid(), {}, None
        _local.writer, _local.q = FrameWriter(), torch.empty(0, dtype=torch.int8)
    return _local


def _zstd_compressor(level: int, threads: int) -> zstandard.ZstdCompressor:
    compressors = _thread_state().compressors
    if (level, threads) not in compressors:
        compressors[level, threads] = zstandard.ZstdCompressor(level=level, threads=threads, write_checksum=False,
                                                               write_content_size=True)
    return compressors[level, threads]


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    state = _thread_state()
    if state.decompressor is None:
        state.decompressor = zstandard.ZstdDecompressor()
    return state.decompressor


def _q_buffer(size: int) -> torch.Tensor:
    state = _thread_state()
    if state.q.numel() < size:
        state.q = torch.empty(size, dtype=torch.int8)
    return state.q[:size]


def check_encode_args(tensor, block_size, zstd_level, target_error, zstd_threads) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"encode takes a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in DTYPE_CODES:
        raise ValueError(f"encode takes float32, float16 or bfloat16 tensors, got {tensor.dtype}")
    if tensor.dim() > MAX_NDIM:
        raise ValueError(f"tensor has {tensor.dim()} dimensions, the frame holds at most {MAX_NDIM}")
    if not isinstance(block_size, int) or not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise ValueError(f"block_size must be an integer in 1..{MAX_BLOCK_SIZE}, got {block_size!r}")
    if not isinstance(zstd_level, int) or not 1 <= zstd_level <= 22:
        raise ValueError(f"zstd_level must be an integer in 1..22, got {zstd_level!r}")
    if not 0 <= target_error < 0.5:
        raise ValueError(f"target_error must be in [0, 0.5), got {target_error!r}")
    if not isinstance(zstd_threads, int) or zstd_threads < 0:
        raise ValueError(f"zstd_threads must be a non-negative integer, got {zstd_threads!r}")


def encode_values(values: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, *, block_size: int,
                  zstd_level: int, target_error: float, zstd_threads: int,
                  want_decoded: bool = False) -> tuple[bytes, torch.Tensor | None]:
    """Frame for the flat CPU tensor `values` declared as (shape, dtype); arguments already checked.

    With want_decoded, also return what a peer will decode (flat, `dtype`), for error feedback."""
    n = values.numel()
    q, scales = quantize(values, block_size, target_error, scale_limit(dtype),
                         q_out=_q_buffer(-(-n // block_size) * block_size))
    q_np = q.numpy()[:n]

    def write_payload(writer: FrameWriter) -> None:
        # zstd reads the int8 values in place and streams its output into the frame buffer. (Feeding
        # it chunk by chunk as they are quantised was measured slower: the two evict each other's cache.)
        if n:
            sink = cast(IO[bytes], writer)  # FrameWriter has the one method zstd calls, write
            with _zstd_compressor(zstd_level, zstd_threads).stream_writer(sink, size=n, closefd=False) as zw:
                zw.write(q_np.data)

    def scale_bytes() -> memoryview:
        return scales.to(torch.bfloat16).view(torch.int16).numpy().data.cast("B")

    header = FrameHeader(dtype=dtype, shape=tuple(shape), block_size=block_size, payload_bytes=0)
    frame = _thread_state().writer.frame(header, write_payload, scale_bytes,
                                         capacity_hint=header.payload_offset + n + n // 64 + 4096)
    decoded = dequantize(q_np, scales, block_size, n, dtype) if want_decoded else None
    return frame, decoded


def encode(tensor: torch.Tensor, *, block_size: int = DEFAULT_BLOCK_SIZE, zstd_level: int = DEFAULT_ZSTD_LEVEL,
           target_error: float = DEFAULT_TARGET_ERROR, zstd_threads: int = 0) -> bytes:
    """Encode a float32 / float16 / bfloat16 tensor of any shape (CPU; others are copied to CPU).

    zstd_threads > 0 compresses on that many zstd worker threads (same bytes, less wall time); torch's
    own thread setting drives the quantiser. Raises ValueError for NaN / Inf values or bad arguments."""
    check_encode_args(tensor, block_size, zstd_level, target_error, zstd_threads)
    values = tensor.detach().cpu().reshape(-1)
    if not values.is_contiguous():
        values = values.contiguous()
    frame, _ = encode_values(values, tensor.shape, tensor.dtype, block_size=block_size, zstd_level=zstd_level,
                             target_error=target_error, zstd_threads=zstd_threads)
    return frame


def _decompress(payload: memoryview, numel: int) -> bytes:
    """Exactly `numel` bytes from a single zstd frame, or CodecError. Never allocates more than numel."""
    try:
        params = zstandard.get_frame_parameters(payload)
    except zstandard.ZstdError as e:
        raise CodecError(f"payload has no valid zstd frame header ({e})") from None
    if params.content_size == zstandard.CONTENTSIZE_UNKNOWN:
        raise CodecError("zstd frame does not declare its content size")
    if params.content_size != numel:
        raise CodecError(f"zstd frame declares {params.content_size} bytes of content, the shape needs {numel}")
    if params.dict_id != 0:
        raise CodecError(f"zstd frame needs dictionary {params.dict_id}; the codec uses none")
    try:
        raw = _zstd_decompressor().decompress(payload, max_output_size=numel, allow_extra_data=False)
    except zstandard.ZstdError as e:
        raise CodecError(f"payload does not decompress: {e}") from None
    if len(raw) != numel:
        raise CodecError(f"payload holds {len(raw)} values, the shape needs {numel}")
    return raw


def _scales(parsed_scales: memoryview, dtype: torch.dtype) -> torch.Tensor:
    """The frame's scales as float32, checked: finite, non-negative, small enough that no value of
    the block can decode to Inf in `dtype`."""
    if len(parsed_scales) == 0:
        return torch.empty(0, dtype=torch.float32)
    scales = torch.from_numpy(np.frombuffer(parsed_scales, dtype=np.int16).copy()).view(torch.bfloat16).float()
    limit = scale_limit(dtype)
    bad = ~torch.isfinite(scales) | (scales < 0) | (scales > limit)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        value = float(scales[i])
        what = ("not finite" if not np.isfinite(value) else "negative" if value < 0
                else f"larger than {limit:g}, which would overflow {dtype}")
        raise CodecError(f"scale of block {i} is {value!r}: {what}")
    return scales


def _check_out(out: torch.Tensor | None, header) -> None:
    if out is None:
        return
    if not isinstance(out, torch.Tensor) or out.device.type != "cpu" or not out.is_contiguous():
        raise ValueError("out must be a contiguous CPU tensor")
    if out.dtype != header.dtype or tuple(out.shape) != header.shape:
        raise CodecError(f"frame holds {header.dtype} {header.shape}, out is {out.dtype} {tuple(out.shape)}")


def decode(data, *, max_elements: int = DEFAULT_MAX_ELEMENTS, out: torch.Tensor | None = None) -> torch.Tensor:
    """The tensor a frame holds (its dtype and shape). Raises CodecError, and only that, for bad input.

    max_elements bounds what the frame may declare; nothing is decompressed or allocated beyond it.
    out: a contiguous CPU tensor of the frame's dtype and shape to decode into (reused across rounds,
    it saves the page faults of a fresh tensor); a frame that does not match it is a CodecError."""
    if not isinstance(max_elements, int) or max_elements < 0:
        raise ValueError(f"max_elements must be a non-negative integer, got {max_elements!r}")
    frame = parse_frame(data, max_elements)
    header = frame.header
    _check_out(out, header)
    scales = _scales(frame.scales, header.dtype)
    if header.numel == 0:
        return torch.empty(header.shape, dtype=header.dtype) if out is None else out
    raw = _decompress(frame.payload, header.numel)
    if out is not None:
        dequantize(raw, scales, header.block_size, header.numel, header.dtype, out=out.view(-1))
        return out
    return dequantize(raw, scales, header.block_size, header.numel, header.dtype).view(header.shape)
