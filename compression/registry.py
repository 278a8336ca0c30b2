"""The codecs a swarm spec can name: the built-in ones and the one table that maps `[codec] kind` to a class.

`Int8Codec` (int8.py: blockwise int8 + zstd, every value) and `SparseCodec` (sparse.py: per-chunk top-k at a few
bits) implement base.py's `Codec` over their kernels. A frame of one kind is a CodecError to the other (different
magic): a swarm's spec says which kind its peers send. Adding a codec: one `Codec` subclass with a `name`, and one
entry in CODECS; the spec, the round rule, error feedback and the frame limits then know it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from pathswarm.compression import frame, sparse
from pathswarm.compression.base import Codec, zstd_bound
from pathswarm.compression.frame import CRC_BYTES, MAX_NDIM
from pathswarm.compression.int8 import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_TARGET_ERROR,
    DEFAULT_ZSTD_LEVEL,
    check_encode_args,
    decode,
    encode_values,
)
from pathswarm.compression.sparse import check_sparse_args, decode_sparse, encode_sparse_values


@dataclass(frozen=True)
class Int8Codec(Codec):
    """Blockwise int8 + zstd, every value: `[codec] kind = "int8"`."""

    name: ClassVar[str] = "int8"
    block_size: int = DEFAULT_BLOCK_SIZE
    zstd_level: int = DEFAULT_ZSTD_LEVEL
    target_error: float = DEFAULT_TARGET_ERROR
    zstd_threads: int = 0

    @classmethod
    def for_contribution(cls, spec: Any) -> Int8Codec:
        return cls(spec.block_size, spec.zstd_level, spec.target_error)

    def check(self, tensor: torch.Tensor) -> None:
        check_encode_args(tensor, self.block_size, self.zstd_level, self.target_error, self.zstd_threads)

    def encode_values(self, flat: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype,
                      want_decoded: bool = False) -> tuple[bytes, torch.Tensor | None]:
        return encode_values(flat, shape, dtype, block_size=self.block_size, zstd_level=self.zstd_level,
                             target_error=self.target_error, zstd_threads=self.zstd_threads,
                             want_decoded=want_decoded)

    def decode(self, data: Any, max_elements: int) -> torch.Tensor:
        return decode(data, max_elements=max_elements)

    def max_frame_bytes(self, numel: int) -> int:
        # header and the largest shape, one bfloat16 scale per block, the zstd frame of numel int8 values, the CRC
        n_blocks = -(-numel // self.block_size)
        return (frame.FIXED_HEADER_BYTES + 8 * MAX_NDIM + frame.SCALE_BYTES * n_blocks + zstd_bound(numel)
                + CRC_BYTES)


@dataclass(frozen=True)
class SparseCodec(Codec):
    """Per-chunk top-k at a few bits: `[codec] kind = "sparse"`."""

    name: ClassVar[str] = "sparse"
    auto_feedback: ClassVar[str] = "weights"  # measured in benchmarks/sparse_vs_int8.py
    chunk_size: int = 4096
    k: int | None = 41
    """Entries sent per chunk; None: every non-zero entry (how a round's mean is sent)."""
    bits: int = 2
    zstd_level: int = DEFAULT_ZSTD_LEVEL

    @classmethod
    def for_contribution(cls, spec: Any) -> SparseCodec:
        return cls(spec.chunk_size, spec.k_per_chunk, spec.value_bits, spec.zstd_level)

    @classmethod
    def for_mean(cls, spec: Any) -> SparseCodec:
        # every non-zero entry (the union of the contributions' supports) at mean_bits, or its largest
        # mean_k_per_chunk per chunk (a downlink as cheap as the uplink)
        return cls(spec.chunk_size, getattr(spec, "mean_k_per_chunk", 0) or None, spec.mean_bits, spec.zstd_level)

    def check(self, tensor: torch.Tensor) -> None:
        check_encode_args(tensor, DEFAULT_BLOCK_SIZE, self.zstd_level, 0.0, 0)  # type, dtype and rank
        check_sparse_args(self.chunk_size, self.k, self.bits, self.zstd_level)

    def encode_values(self, flat: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype,
                      want_decoded: bool = False) -> tuple[bytes, torch.Tensor | None]:
        flat = flat if flat.dtype == torch.float32 else flat.float().contiguous()
        return encode_sparse_values(flat, shape, dtype, chunk_size=self.chunk_size, k=self.k, bits=self.bits,
                                    zstd_level=self.zstd_level, want_decoded=want_decoded)

    def decode(self, data: Any, max_elements: int) -> torch.Tensor:
        # A frame must have this codec's chunk size, bits and (for contributions) at most k entries per chunk: one
        # member's dense frame would otherwise make the round's mean, and every member's download, dense too.
        return decode_sparse(data, max_elements=max_elements, expect=(self.chunk_size, self.k, self.bits))

    def max_frame_bytes(self, numel: int) -> int:
        # header and the largest shape, lo / hi per chunk, the zstd frame of counts, distances and codes, the CRC
        n_chunks = -(-numel // self.chunk_size)
        entries = numel if self.k is None else min(numel, self.k * n_chunks)
        body = 2 * n_chunks + 2 * entries + -(-entries * self.bits // 8)
        return (sparse.FIXED_HEADER_BYTES + 8 * MAX_NDIM + sparse.SCALE_BYTES * n_chunks + zstd_bound(body)
                + CRC_BYTES)


CODECS: dict[str, type[Codec]] = {codec.name: codec for codec in (Int8Codec, SparseCodec)}
"""The table: the spec's `[codec] kind` → the codec class (which builds itself from the spec's parameters)."""


def codec_kinds() -> tuple[str, ...]:
    """The kinds a spec may name, sorted."""
    return tuple(sorted(CODECS))


def codec_class(kind: str) -> type[Codec]:
    """The codec class of a `[codec] kind`; ValueError naming the known kinds for any other."""
    try:
        return CODECS[kind]
    except (KeyError, TypeError):
        raise ValueError(f"unknown codec kind {kind!r} (known: {', '.join(codec_kinds())})") from None
