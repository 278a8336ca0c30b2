"""The outer-gradient codec: blockwise int8 + zstd in a checked frame, with error feedback.

Pure tensors → bytes → tensors; no networking. `encode(tensor)` returns one self-describing frame
(frame.py has the layout), `decode(data, max_elements=…)` returns the tensor and raises `CodecError`,
and only that, for any bad input; `ErrorFeedback` carries each module's quantisation residual into
its next round. Figures and the choice of quantiser: benchmarks/codec.py.
"""

from pathswarm.compression.codec import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MAX_ELEMENTS,
    DEFAULT_TARGET_ERROR,
    DEFAULT_ZSTD_LEVEL,
    decode,
    encode,
)
from pathswarm.compression.feedback import ErrorFeedback
from pathswarm.compression.frame import CodecError

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_MAX_ELEMENTS",
    "DEFAULT_TARGET_ERROR",
    "DEFAULT_ZSTD_LEVEL",
    "CodecError",
    "ErrorFeedback",
    "decode",
    "encode",
]
