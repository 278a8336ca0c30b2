"""The one interface every outer-gradient codec implements, so the round rule, the spec, error feedback and the
frame limits ask the codec instead of assuming one (after hivemind's compression/base.py: one base class, one table).

A codec turns a flat tensor into one self-describing frame (`encode_values`, optionally with what a peer will decode,
for error feedback) and a frame back into a tensor (`decode`, CodecError and only that for bad input), and says how
large an honest frame can be (`max_frame_bytes`), so a receiver bounds what it reads before it reads it. The swarm
spec's `[codec] kind` names a class in the table (registry.py); the class builds itself from the spec
(`for_contribution`: how a member sends its outer gradient; `for_mean`: how a reducer sends a round's mean).
Adding a codec is one subclass and one entry in that table.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import torch


def zstd_bound(size: int) -> int:
    """A generous bound on the zstd frame of `size` input bytes, whatever they are: zstd's own ZSTD_compressBound is
    size + size / 256 + at most 64 bytes (incompressible input is stored in raw blocks of 128 KiB, 3 header bytes
    each); this takes twice its margin and 4 KiB for the frame header, so no zstd version or level exceeds it."""
    return size + (size >> 7) + 4096


class Codec(abc.ABC):
    """One way of sending a float tensor as bytes. Instances are immutable and hold the codec's parameters."""

    name: ClassVar[str]
    """The spec's `[codec] kind` that selects this codec (registry.py)."""
    auto_feedback: ClassVar[str] = "buffer"
    """Where `[codec] feedback = "auto"` keeps what a frame did not carry: "buffer" (a residual added to the next
    outer gradient) or "weights" (left in the local weights)."""

    @classmethod
    def for_contribution(cls, spec: Any) -> Codec:
        """How a member encodes its outer gradient, from the spec's `[codec]` table (protocol/spec_codec.py's
        CodecSpec; any object with its attributes)."""
        return cls()

    @classmethod
    def for_mean(cls, spec: Any) -> Codec:
        """How a reducer encodes a round's mean; by default as a contribution."""
        return cls.for_contribution(spec)

    @abc.abstractmethod
    def check(self, tensor: torch.Tensor) -> None:
        """Raise ValueError if this codec cannot encode `tensor` (type, dtype, rank, its own parameters)."""

    @abc.abstractmethod
    def encode_values(self, flat: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype,
                      want_decoded: bool = False) -> tuple[bytes, torch.Tensor | None]:
        """The frame of the flat contiguous CPU float tensor `flat`, declared as (shape, dtype); `check` passed.
        With want_decoded, also what a peer will decode (flat, float32 or `dtype`), for error feedback; else None.
        Raises ValueError for NaN / Inf values."""

    @abc.abstractmethod
    def decode(self, data: Any, max_elements: int) -> torch.Tensor:
        """The tensor a frame holds (its shape and dtype). Raises CodecError, and only that, for bad input; nothing
        beyond `max_elements` values is allocated or decompressed."""

    @abc.abstractmethod
    def max_frame_bytes(self, numel: int) -> int:
        """An upper bound on the size of any frame an honest encoder with these parameters makes for a tensor of
        `numel` values (any shape, any dtype, incompressible values): a receiver refuses longer frames unread."""

    def encode(self, tensor: torch.Tensor) -> bytes:
        """One frame of `tensor` (any shape, float32 / float16 / bfloat16; copied to CPU)."""
        self.check(tensor)
        flat = tensor.detach().to("cpu").reshape(-1)
        return self.encode_values(flat.contiguous(), tuple(tensor.shape), tensor.dtype)[0]


def encode_with(codec: Codec, tensor: torch.Tensor) -> bytes:
    """One frame of `tensor` with `codec`: `codec.encode(tensor)`."""
    return codec.encode(tensor)
