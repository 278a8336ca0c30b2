"""The `[codec]` table of a swarm spec: which codec carries outer gradients, and its parameters.

The kinds are the entries of compression/registry.py's table, and the spec asks the codec rather than knowing it:
which frames a member and a reducer send (`contribution_codec`, `mean_codec`), how large an honest frame can be
(`max_frame_bytes`, the bound a receiver reads within) and where error feedback lives by default. compression/ is
imported only when a codec is asked for (or a kind checked), so importing the spec needs no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pathswarm.protocol.spec_sections import require

if TYPE_CHECKING:
    from pathswarm.compression.base import Codec


@dataclass(frozen=True)
class CodecSpec:
    """How outer gradients travel: `kind` names a codec of the table in compression/registry.py, "int8" (blockwise
    int8 + zstd, every value; compression/int8.py) or "sparse" (per-chunk top-k at a few bits; compression/sparse.py),
    with error feedback. The codec reads the fields it needs (`contribution_codec`, `mean_codec`)."""

    kind: str = "int8"
    """Which codec every peer of the swarm sends (a frame of the other kind is rejected as undecodable)."""
    block_size: int = 256
    """int8: values per quantisation block (one scale each)."""
    zstd_level: int = 1
    """zstd level; higher levels gain nothing on quantised pseudo-gradients (measured)."""
    error_feedback: bool = True
    """Carry each round's quantisation residual (sparse: and every entry not sent) into the next round."""
    target_error: float = 0.013
    """int8: relative RMS error the quantisation step aims at (encoder-only; 0 = plain absmax int8)."""
    chunk_size: int = 4096
    """sparse: values per chunk (top-k is taken per chunk; at most 65535)."""
    k_per_chunk: int = 41
    """sparse: entries a contribution sends per chunk (41 of 4096 is 1 %)."""
    value_bits: int = 2
    """sparse: bits per sent value of a contribution (a sign and value_bits − 1 bits of magnitude)."""
    mean_bits: int = 8
    """sparse: bits per value of a round's mean (every non-zero entry: the union of the contributions')."""
    mean_k_per_chunk: int = 0
    """sparse: entries of a round's mean sent per chunk, its largest (0: every non-zero entry, the union of the
    contributions'). With k_per_chunk here (and mean_bits = value_bits) the downlink costs what the uplink does."""
    feedback: str = "auto"
    """Where a member keeps what its frame did not carry: "buffer" (a residual added to the next outer gradient;
    the local weights restart from the new anchor, as in DiLoCo and SparseLoCo), "weights" (it stays in the local
    weights, which restart from the new anchor minus it, so training goes on from it instead of learning it
    again), or "auto": the codec's choice, buffer for int8, weights for sparse (measured in
    benchmarks/sparse_vs_int8.py). It changes only members' local weights, never the merged state; like every field
    it is part of the swarm id."""

    def validate(self) -> None:
        from pathswarm.compression.registry import CODECS, codec_kinds  # here: importing the spec needs no torch

        require(self.kind in CODECS, "codec.kind", f"unknown codec {self.kind!r} (known: {', '.join(codec_kinds())})")
        require(self.block_size > 0, "codec.block_size", "must be positive")
        require(0 <= self.target_error <= 0.5, "codec.target_error", "must be in [0, 0.5]")
        require(1 <= self.zstd_level <= 22, "codec.zstd_level", "must be in 1..22")
        require(1 <= self.chunk_size <= 65535, "codec.chunk_size", "must be in 1..65535")
        require(1 <= self.k_per_chunk <= self.chunk_size, "codec.k_per_chunk", "must be in 1..chunk_size")
        require(2 <= self.value_bits <= 8, "codec.value_bits", "must be in 2..8")
        require(2 <= self.mean_bits <= 8, "codec.mean_bits", "must be in 2..8")
        require(0 <= self.mean_k_per_chunk <= self.chunk_size, "codec.mean_k_per_chunk",
                "must be in 0..chunk_size (0: every non-zero entry)")
        require(self.feedback in ("auto", "buffer", "weights"), "codec.feedback", "must be auto, buffer or weights")

    @property
    def feedback_in_weights(self) -> bool:
        """Whether a member keeps what its frame did not carry in its local weights (else in a residual buffer)."""
        if not self.error_feedback:
            return False
        if self.feedback == "auto":
            return self._codec_class().auto_feedback == "weights"
        return self.feedback == "weights"

    def contribution_codec(self) -> Codec:
        """How a member encodes its outer gradient: the kind's codec with this table's parameters."""
        return self._codec_class().for_contribution(self)

    def mean_codec(self) -> Codec:
        """How a reducer encodes a round's mean (sparse: every non-zero entry of the union at mean_bits; int8: as a
        contribution)."""
        return self._codec_class().for_mean(self)

    def max_contribution_bytes(self, numel: int) -> int:
        """The largest contribution frame an honest member sends for a module of `numel` values, whatever the values:
        a reducer refuses a longer one before reading it."""
        return self.contribution_codec().max_frame_bytes(numel)

    def max_mean_bytes(self, numel: int) -> int:
        """The largest mean frame an honest reducer sends for a module of `numel` values."""
        return self.mean_codec().max_frame_bytes(numel)

    def max_frame_bytes(self, numel: int) -> int:
        """The larger of the two: a bound for any frame of this swarm's rounds (contribution or mean)."""
        return max(self.max_contribution_bytes(numel), self.max_mean_bytes(numel))

    def _codec_class(self) -> type[Codec]:
        from pathswarm.compression.registry import codec_class

        return codec_class(self.kind)
