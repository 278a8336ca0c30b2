"""The codec's wire format: one self-describing frame per tensor, packed and parsed with every field checked.

Layout (all integers little-endian)::

    offset        size          field
    0             4             magic b"PSWQ"
    4             1             format version (1)
    5             1             dtype code: 1 float32, 2 float16, 3 bfloat16
    6             1             ndim (0..64)
    7             1             flags (reserved, 0)
    8             4             block_size, u32 (1..2^20)
    12            8             payload_bytes, u64: length of the zstd frame below
    20            8*ndim        shape, u64 per dimension
    ...           2*n_blocks    per-block scales, bfloat16; n_blocks = ceil(numel / block_size)
    ...           payload_bytes zstd frame of the numel int8 values (absent when numel = 0)
    end - 4       4             CRC-32 (zlib) of every byte before it

Value i decodes to int8[i] * scale[i // block_size]. Scales are stored as bfloat16 (rounded up by the
encoder so |x| / scale never exceeds 127): half the bytes of float32 scales for the same range, and the
coarser scale costs nothing in accuracy because the int8 values are rounded against the stored scale.

Anything parsed here comes from an untrusted peer: `parse_frame` checks lengths before reading, bounds
the declared size by `max_elements` before anything is allocated, and raises `CodecError` (naming the
field) for every inconsistency. It never decompresses; `codec.decode` does, within the checked size.
"""

from __future__ import annotations

import dataclasses
import math
import struct
import sys
import zlib
from dataclasses import dataclass

import torch

if sys.byteorder != "little":  # scales and int8 payload are read with the host's byte order
    raise ImportError("pathswarm.compression supports little-endian hosts only")

MAGIC = b"PSWQ"
VERSION = 1
MAX_NDIM = 64
MAX_BLOCK_SIZE = 1 << 20
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"

DTYPE_CODES: dict[torch.dtype, int] = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}
CODE_DTYPES: dict[int, torch.dtype] = {v: k for k, v in DTYPE_CODES.items()}

_FIXED = struct.Struct("<4sBBBBIQ")  # magic, version, dtype, ndim, flags, block_size, payload_bytes
FIXED_HEADER_BYTES = _FIXED.size  # 20
SCALE_BYTES = 2
CRC_BYTES = 4


class CodecError(ValueError):
    """A frame is not a valid codec frame; the message says which field is wrong and how."""


@dataclass(frozen=True)
class FrameHeader:
    dtype: torch.dtype
    shape: tuple[int, ...]
    block_size: int
    payload_bytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def n_blocks(self) -> int:
        return -(-self.numel // self.block_size)

    @property
    def scales_offset(self) -> int:
        return FIXED_HEADER_BYTES + 8 * len(self.shape)

    @property
    def payload_offset(self) -> int:
        return self.scales_offset + SCALE_BYTES * self.n_blocks

    @property
    def frame_bytes(self) -> int:
        return self.payload_offset + self.payload_bytes + CRC_BYTES


def pack_header(header: FrameHeader) -> bytes:
    fixed = _FIXED.pack(MAGIC, VERSION, DTYPE_CODES[header.dtype], len(header.shape), 0,
                        header.block_size, header.payload_bytes)
    return fixed + struct.pack(f"<{len(header.shape)}Q", *header.shape)


def checksum(*parts) -> int:
    """CRC-32 over the parts in order (bytes-like, read in place through the buffer protocol).

    zlib's CRC-32 (measured here: about 1.5-2 GB/s) reads only the compressed frame, about a fifth of
    the fp32 bytes, so it costs roughly a tenth of encode or decode time: not the bottleneck (zstd is).
    xxhash is not among the dependencies, and zstd's own checksum would cover the payload only. The CRC
    guards against corruption in transit, not against a malicious peer: every field is validated too."""
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    return crc


class FrameWriter:
    """Builds frames in one reusable buffer: zstd streams the payload straight in (this object is its
    output file), then the header and scales fill the space reserved before it and the checksum is
    appended. Returning the frame as `bytes` is the only copy of the compressed data. One per thread."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._end = 0

    def write(self, data) -> int:
        """Append bytes (the file protocol zstd's stream writer calls)."""
        end = self._end + len(data)
        if end > len(self._buffer):
            self._buffer.extend(bytes(max(end, 2 * len(self._buffer)) - len(self._buffer)))
        self._buffer[self._end:end] = data
        self._end = end
        return len(data)

    def frame(self, header: FrameHeader, write_payload, scales, capacity_hint: int) -> bytes:
        """The complete frame. `write_payload(self)` writes the zstd frame (header.payload_bytes is
        ignored); then `scales()` returns the scale bytes, which fill the space reserved before it."""
        if len(self._buffer) < capacity_hint:
            self._buffer = bytearray(capacity_hint)
        self._end = header.payload_offset
        write_payload(self)
        payload_bytes = self._end - header.payload_offset
        self._buffer[:header.scales_offset] = pack_header(dataclasses.replace(header, payload_bytes=payload_bytes))
        scale_bytes = scales()
        if len(scale_bytes) != header.payload_offset - header.scales_offset:
            raise AssertionError("scale bytes do not fill the space reserved for them")
        self._buffer[header.scales_offset:header.payload_offset] = scale_bytes
        with memoryview(self._buffer) as view:
            crc = checksum(view[:self._end])
        self.write(crc.to_bytes(CRC_BYTES, "little"))
        with memoryview(self._buffer) as view:
            return bytes(view[:self._end])


@dataclass(frozen=True)
class ParsedFrame:
    header: FrameHeader
    scales: memoryview
    """n_blocks bfloat16 values, a view into the frame (no copy)."""
    payload: memoryview
    """The zstd frame, a view into the frame (no copy)."""


def read_shape(view: memoryview, at: int, dtype_code: int, ndim: int, max_elements: int) -> tuple[int, ...]:
    """The dtype code and the shape stored at `at` (u64 per dimension), checked, in any codec's frame: the shape is
    bounded by max_elements before anything is sized from it. The product of the non-zero dimensions also keeps an
    empty tensor from declaring absurd extents (strides that overflow int64)."""
    if dtype_code not in CODE_DTYPES:
        raise CodecError(f"unknown dtype code {dtype_code} (known: {sorted(CODE_DTYPES)})")
    if ndim > MAX_NDIM:
        raise CodecError(f"ndim {ndim} exceeds the maximum of {MAX_NDIM}")
    if len(view) < at + 8 * ndim + CRC_BYTES:
        raise CodecError(f"frame truncated: {len(view)} bytes, too short for a {ndim}-dimensional shape")
    shape = struct.unpack_from(f"<{ndim}Q", view, at)
    numel = math.prod(shape)
    if numel > max_elements:
        raise CodecError(f"shape {shape} declares {numel} elements, more than max_elements = {max_elements}")
    if math.prod(d for d in shape if d) > max(max_elements, 1):
        raise CodecError(f"empty shape {shape} has dimensions beyond max_elements = {max_elements}")
    return shape


def parse_frame(data, max_elements: int) -> ParsedFrame:
    """Check a frame's structure and checksum; return views of its parts. Raises only CodecError."""
    try:
        view = memoryview(data).cast("B")
    except (TypeError, ValueError, BufferError):
        raise CodecError(f"a frame must be bytes-like, got {type(data).__name__}") from None
    size = len(view)
    if size < FIXED_HEADER_BYTES + CRC_BYTES:
        raise CodecError(f"frame truncated: {size} bytes, shorter than the fixed header and checksum "
                         f"({FIXED_HEADER_BYTES + CRC_BYTES} bytes)")
    magic, version, dtype_code, ndim, flags, block_size, payload_bytes = _FIXED.unpack_from(view, 0)
    if magic != MAGIC:
        raise CodecError(f"bad magic {bytes(magic)!r}, expected {MAGIC!r}: not a pathswarm codec frame")
    if version != VERSION:
        raise CodecError(f"unsupported format version {version} (this build reads version {VERSION})")
    if flags != 0:
        raise CodecError(f"reserved flags byte is {flags}, expected 0")
    if not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise CodecError(f"block size {block_size} outside 1..{MAX_BLOCK_SIZE}")
    shape = read_shape(view, FIXED_HEADER_BYTES, dtype_code, ndim, max_elements)
    header = FrameHeader(dtype=CODE_DTYPES[dtype_code], shape=shape, block_size=block_size,
                         payload_bytes=payload_bytes)
    if size < header.frame_bytes:
        raise CodecError(f"frame truncated: {size} bytes, the header declares {header.frame_bytes}")
    if size > header.frame_bytes:
        raise CodecError(f"frame extended: {size} bytes, the header declares {header.frame_bytes} "
                         f"({size - header.frame_bytes} trailing bytes)")
    stored = int.from_bytes(view[size - CRC_BYTES:], "little")
    computed = checksum(view[:size - CRC_BYTES])
    if stored != computed:
        raise CodecError(f"checksum mismatch: frame says {stored:#010x}, contents give {computed:#010x}")
    if header.numel == 0 and payload_bytes != 0:
        raise CodecError(f"an empty tensor carries no payload, but payload_bytes = {payload_bytes}")
    if header.numel > 0 and bytes(view[header.payload_offset:header.payload_offset + 4]) != ZSTD_MAGIC:
        raise CodecError("payload is not a zstd frame (bad zstd magic)")
    return ParsedFrame(header=header,
                       scales=view[header.scales_offset:header.payload_offset],
                       payload=view[header.payload_offset:header.payload_offset + payload_bytes])
