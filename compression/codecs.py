"""The two outer-gradient codecs behind one small interface, so the round rule and error feedback need not care.

`Int8Codec` (codec.py: blockwise int8 + zstd, every value) and `SparseCodec` (sparse.py: per-chunk top-k at a few
bits). Each turns a flat float32 tensor into one frame (`encode_values`, optionally with what a peer will decode,
for error feedback) and a frame back into a tensor (`decode`, CodecError and only that for bad input). A frame
of one kind is a CodecError to the other (different magic): a swarm's spec says which kind its peers send.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pathswarm.compression.codec import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_TARGET_ERROR,
    DEFAULT_ZSTD_LEVEL,
    check_encode_args,
    decode,
    encode_values,
)
from pathswarm.compression.sparse import check_sparse_args, decode_sparse, encode_sparse_values


@dataclass(frozen=True)
class Int8Codec:
    block_size: int = DEFAULT_BLOCK_SIZE
    zstd_level: int = DEFAULT_ZSTD_LEVEL
    target_error: float = DEFAULT_TARGET_ERROR
    zstd_threads: int = 0

    def check(self, tensor: torch.Tensor) -> None:
        check_encode_args(tensor, self.block_size, self.zstd_level, self.target_error, self.zstd_threads)

    def encode_values(self, flat: torch.Tensor, shape, dtype: torch.dtype,
                      want_decoded: bool = False) -> tuple[bytes, torch.Tensor | None]:
        return encode_values(flat, shape, dtype, block_size=self.block_size, zstd_level=self.zstd_level,
                             target_error=self.target_error, zstd_threads=self.zstd_threads,
                             want_decoded=want_decoded)

    def decode(self, data, max_elements: int) -> torch.Tensor:
        return decode(data, max_elements=max_elements)


@dataclass(frozen=True)
class SparseCodec:
    chunk_size: int = 4096
    k: int | None = 41
    """Entries sent per chunk; None: every non-zero entry (how a round's mean is sent)."""
    bits: int = 2
    zstd_level: int = DEFAULT_ZSTD_LEVEL

    def check(self, tensor: torch.Tensor) -> None:
        check_encode_args(tensor, DEFAULT_BLOCK_SIZE, self.zstd_level, 0.0, 0)  # type, dtype and rank
        check_sparse_args(self.chunk_size, self.k, self.bits, self.zstd_level)

    def encode_values(self, flat: torch.Tensor, shape, dtype: torch.dtype,
                      want_decoded: bool = False) -> tuple[bytes, torch.Tensor | None]:
        return encode_sparse_values(flat, shape, dtype, chunk_size=self.chunk_size, k=self.k, bits=self.bits,
                                    zstd_level=self.zstd_level, want_decoded=want_decoded)

    def decode(self, data, max_elements: int) -> torch.Tensor:
        # A frame must have this codec's chunk size, bits and (for contributions) at most k entries per chunk: one
        # member's dense frame would otherwise make the round's mean, and every member's download, dense too.
        return decode_sparse(data, max_elements=max_elements, expect=(self.chunk_size, self.k, self.bits))


Codec = Int8Codec | SparseCodec


def encode_with(codec: Codec, tensor: torch.Tensor) -> bytes:
    """One frame of `tensor` (any shape, float32 / float16 / bfloat16) with `codec`."""
    codec.check(tensor)
    flat = tensor.detach().to("cpu").reshape(-1)
    if flat.dtype != torch.float32 and isinstance(codec, SparseCodec):
        flat = flat.float()
    return codec.encode_values(flat.contiguous(), tuple(tensor.shape), tensor.dtype)[0]
