"""The outer-gradient codecs behind one interface: blockwise int8 + zstd, or sparse top-k, in a checked frame.

Pure tensors → bytes → tensors; no networking. `Codec` (base.py) is the interface and `CODECS` (registry.py) the
table of the kinds a swarm spec may name: `Int8Codec` (int8.py, with quantize.py's kernels and frame.py's layout)
and `SparseCodec` (sparse.py). `encode(tensor)` / `decode(data, max_elements=…)` are the int8 codec's functions
with its defaults; decoding raises `CodecError`, and only that, for any bad input. `ErrorFeedback` carries each
module's residual into its next round, with any codec. Figures and the choice of quantiser: benchmarks/codec.py.
"""

from pathswarm.compression.base import Codec, encode_with
from pathswarm.compression.feedback import ErrorFeedback
from pathswarm.compression.frame import CodecError
from pathswarm.compression.int8 import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MAX_ELEMENTS,
    DEFAULT_TARGET_ERROR,
    DEFAULT_ZSTD_LEVEL,
    decode,
    encode,
)
from pathswarm.compression.registry import CODECS, Int8Codec, SparseCodec, codec_class, codec_kinds

__all__ = [
    "CODECS",
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_MAX_ELEMENTS",
    "DEFAULT_TARGET_ERROR",
    "DEFAULT_ZSTD_LEVEL",
    "Codec",
    "CodecError",
    "ErrorFeedback",
    "Int8Codec",
    "SparseCodec",
    "codec_class",
    "codec_kinds",
    "decode",
    "encode",
    "encode_with",
]
