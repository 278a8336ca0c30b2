"""The sparse outer-gradient codec: per-chunk top-k, low-bit values, zstd; a checked frame, and back.

Beside blockwise int8 (int8.py), for swarms whose uplinks are the limit (SparseLoCo, arXiv 2508.15706, sends
1–3 % of entries at 2 bits). The tensor is cut into chunks of `chunk_size` values; each chunk sends its `k`
largest-magnitude entries (exact zeros are never sent), the rest is left to error feedback (feedback.py keeps
compensated − decoded, so everything not sent, and every rounding, is sent in a later round).

Values: `bits` per entry, a sign bit and a (bits − 1)-bit magnitude level. Each chunk stores the smallest and
largest magnitude it sends (lo, hi, as bfloat16) and level m decodes to lo + m · (hi − lo) / (2^(bits−1) − 1):
top-k magnitudes are bounded below by the chunk's threshold, so the levels span [lo, hi] rather than [0, hi].

Positions: within each chunk, sorted; the first is stored as is, each next one as its distance to the previous
(≥ 1). Distances are 16-bit, stored as a plane of low bytes then a plane of high bytes (the high plane is mostly
zeros), with the per-chunk counts in front and the packed value codes after; zstd then codes all of it.

The round's result (the reducer's mean, protocol/rounds/merge.py) is a mean of sparse vectors and is denser than
each: its support is the union of the contributions' supports (up to group size × k per chunk, less where they
overlap). It is encoded with this same format with k = None, i.e. every non-zero entry, at `mean_bits` per value
(the mean has no error feedback: every member applies exactly these bytes, so its rounding is nobody's to resend).
Both directions are counted on the wire: the uplink is k entries per chunk, the downlink the union.

Layout (integers little-endian)::

    offset      size            field
    0           4               magic b"PSWS"
    4           1               format version (1)
    5           1               dtype code: 1 float32, 2 float16, 3 bfloat16 (as in frame.py)
    6           1               ndim (0..64)
    7           1               bits per value (2..8)
    8           4               chunk_size, u32 (1..65535)
    12          8               entries, u64: values sent (<= numel)
    20          8               payload_bytes, u64: length of the zstd frame
    28          8*ndim          shape, u64 per dimension
    ...         4*n_chunks      per chunk: lo, hi magnitudes, bfloat16 each; n_chunks = ceil(numel / chunk_size)
    ...         payload_bytes   zstd frame of: counts (u16 per chunk) | distance low bytes | distance high bytes |
                                value codes, `bits` each, packed most significant bit first
    end - 4     4               CRC-32 (zlib) of every byte before it

Frames come from untrusted peers: `decode_sparse` bounds every size before allocating, checks that counts fit
their chunks, that positions increase strictly and stay inside their chunk, that scales are finite and ordered,
and raises CodecError (naming the field), and only that, for anything malformed.
"""

from __future__ import annotations

import math
import struct
import threading

import numpy as np
import torch
import zstandard

from pathswarm.compression.frame import (
    CODE_DTYPES,
    CRC_BYTES,
    DTYPE_CODES,
    ZSTD_MAGIC,
    CodecError,
    checksum,
    read_shape,
)

MAGIC = b"PSWS"
VERSION = 1
MAX_CHUNK = 65535
"""Positions within a chunk and per-chunk counts are 16-bit."""
MIN_BITS, MAX_BITS = 2, 8
_FIXED = struct.Struct("<4sBBBBIQQ")  # magic, version, dtype, ndim, bits, chunk_size, entries, payload_bytes
FIXED_HEADER_BYTES = _FIXED.size  # 28
SCALE_BYTES = 4  # lo, hi as bfloat16

_local = threading.local()


def _zstd(level: int) -> tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor]:
    cache = getattr(_local, "zstd", None)
    if cache is None:
        cache = _local.zstd = {}
    if level not in cache:
        cache[level] = (zstandard.ZstdCompressor(level=level, write_checksum=False, write_content_size=True),
                        zstandard.ZstdDecompressor())
    return cache[level]


def check_sparse_args(chunk_size: int, k: int | None, bits: int, zstd_level: int) -> None:
    if not isinstance(chunk_size, int) or not 1 <= chunk_size <= MAX_CHUNK:
        raise ValueError(f"chunk_size must be an integer in 1..{MAX_CHUNK}, got {chunk_size!r}")
    if k is not None and (not isinstance(k, int) or not 1 <= k <= chunk_size):
        raise ValueError(f"k must be None (every non-zero entry) or an integer in 1..chunk_size, got {k!r}")
    if not isinstance(bits, int) or not MIN_BITS <= bits <= MAX_BITS:
        raise ValueError(f"bits must be an integer in {MIN_BITS}..{MAX_BITS}, got {bits!r}")
    if not isinstance(zstd_level, int) or not 1 <= zstd_level <= 22:
        raise ValueError(f"zstd_level must be an integer in 1..22, got {zstd_level!r}")


def _bf16_limit(dtype: torch.dtype) -> float:
    """The largest bfloat16 value that is finite in `dtype`: scales are clamped to it, and decoding refuses more."""
    s = torch.tensor([torch.finfo(dtype).max], dtype=torch.float32).to(torch.bfloat16)
    while not torch.isfinite(s.float().to(dtype)).all() or float(s) > torch.finfo(dtype).max:
        s = (s.view(torch.int16) - 1).view(torch.bfloat16)
    return float(s)


def _select(flat: torch.Tensor, chunk: int, k: int | None) -> torch.Tensor:
    """Sorted global positions of the entries to send: per chunk its k largest magnitudes (all non-zero entries
    when k is None), never an exact zero."""
    n = flat.numel()
    if k is None or k >= chunk:
        return flat.nonzero().reshape(-1)
    n_chunks = -(-n // chunk)
    mags = torch.full((n_chunks * chunk,), -1.0, dtype=torch.float32)  # padding sorts below every real entry
    torch.abs(flat, out=mags[:n])
    top = torch.topk(mags.view(n_chunks, chunk), k, dim=1, sorted=False)
    idx = top.indices + (torch.arange(n_chunks) * chunk)[:, None]
    idx = idx[top.values > 0]
    return idx.sort().values


def _levels(codes: np.ndarray, chunk_of: np.ndarray, lo: torch.Tensor, hi: torch.Tensor, bits: int) -> torch.Tensor:
    """The float32 values that codes decode to (one function for encoder and decoder: the same bits on both)."""
    top = (1 << (bits - 1)) - 1
    c = torch.from_numpy(codes.astype(np.int32))
    cid = torch.from_numpy(chunk_of)
    step = (hi - lo) / top
    mag = lo[cid] + (c & top).float() * step[cid]
    return torch.where((c >> (bits - 1)) > 0, -mag, mag)


def _pack_bits(codes: np.ndarray, bits: int) -> bytes:
    """`bits`-bit codes packed most significant bit first (whole bytes and nibbles without a bit-level detour)."""
    if bits == 8 or codes.size == 0:
        return codes.tobytes()
    if bits in (2, 4):
        per = 8 // bits
        padded = np.zeros(-(-codes.size // per) * per, dtype=np.uint8)
        padded[:codes.size] = codes
        groups = padded.reshape(-1, per)
        out = np.zeros(groups.shape[0], dtype=np.uint8)
        for j in range(per):
            out |= groups[:, j] << np.uint8(bits * (per - 1 - j))
        return out.tobytes()
    shifts = np.arange(bits - 1, -1, -1, dtype=np.uint8)
    return np.packbits(((codes[:, None] >> shifts) & 1).astype(np.uint8).reshape(-1)).tobytes()


def _codes(packed: np.ndarray, e0: int, e1: int, bits: int) -> np.ndarray:
    """Codes e0..e1 of `_pack_bits`'s output (`packed`, with one zero byte appended): a code spans at most two bytes."""
    at = np.arange(e0, e1, dtype=np.int64) * bits
    byte, offset = at >> 3, at & 7
    pair = (packed[byte].astype(np.uint16) << 8) | packed[byte + 1]
    return ((pair >> (16 - offset - bits).astype(np.uint16)) & ((1 << bits) - 1)).astype(np.uint8)


def encode_sparse_values(flat: torch.Tensor, shape, dtype: torch.dtype, *, chunk_size: int, k: int | None, bits: int,
                         zstd_level: int = 1, want_decoded: bool = False) -> tuple[bytes, torch.Tensor | None]:
    """Frame for the flat contiguous float32 CPU tensor `flat` declared as (shape, dtype); arguments checked.

    With want_decoded, also return what a peer will decode (flat float32), for error feedback."""
    n = flat.numel()
    n_chunks = -(-n // chunk_size)
    if n and not bool(torch.isfinite(flat).all()):
        raise ValueError("tensor contains NaN or Inf; refusing to encode it")
    idx = _select(flat, chunk_size, k)
    vals = flat[idx]
    chunk_of = (idx // chunk_size).numpy()
    counts = np.bincount(chunk_of, minlength=n_chunks).astype(np.int64)
    mags = vals.abs()
    limit = _bf16_limit(dtype)
    cid = torch.from_numpy(chunk_of)
    lo = torch.full((n_chunks,), math.inf).scatter_reduce(0, cid, mags, "amin")
    hi = torch.zeros(n_chunks).scatter_reduce(0, cid, mags, "amax")
    lo = torch.where(torch.isinf(lo), torch.zeros_like(lo), lo)
    # Stored as bfloat16 (nearest, which keeps lo <= hi); levels are computed from the stored values.
    lo = lo.clamp(max=limit).to(torch.bfloat16).float()
    hi = hi.clamp(max=limit).to(torch.bfloat16).float()
    top = (1 << (bits - 1)) - 1
    step = (hi - lo) / top
    safe = torch.where(step > 0, step, torch.ones_like(step))
    m = torch.where(step[cid] > 0, ((mags - lo[cid]) / safe[cid]).round(), torch.zeros_like(mags)).clamp(0, top)
    codes = (m.to(torch.int32) | ((vals < 0).to(torch.int32) << (bits - 1))).numpy().astype(np.uint8)
    positions = (idx - torch.from_numpy(chunk_of) * chunk_size).numpy()
    distances = positions.copy()
    if positions.size:
        starts = np.cumsum(counts) - counts
        distances[1:] -= positions[:-1]
        distances[starts[counts > 0]] = positions[starts[counts > 0]]
    d16 = distances.astype(np.uint16)
    body = b"".join((counts.astype("<u2").tobytes(), (d16 & 0xFF).astype(np.uint8).tobytes(),
                     (d16 >> 8).astype(np.uint8).tobytes(), _pack_bits(codes, bits)))
    payload = _zstd(zstd_level)[0].compress(body) if n else b""
    scales = torch.stack([lo, hi], dim=1).to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    head = _FIXED.pack(MAGIC, VERSION, DTYPE_CODES[dtype], len(shape), bits, chunk_size, int(idx.numel()),
                       len(payload)) + struct.pack(f"<{len(shape)}Q", *shape)
    frame = head + scales + payload
    frame += checksum(frame).to_bytes(CRC_BYTES, "little")
    decoded = None
    if want_decoded:
        decoded = torch.zeros(n, dtype=torch.float32)
        decoded[idx] = _levels(codes, chunk_of, lo, hi, bits)
        if dtype != torch.float32:  # what the peer decodes is rounded to the declared dtype
            decoded = decoded.to(dtype).float()
    return frame, decoded


def _header(view: memoryview, max_elements: int):
    size = len(view)
    if size < FIXED_HEADER_BYTES + CRC_BYTES:
        raise CodecError(f"frame truncated: {size} bytes, shorter than the fixed header and checksum "
                         f"({FIXED_HEADER_BYTES + CRC_BYTES} bytes)")
    magic, version, dtype_code, ndim, bits, chunk, entries, payload_bytes = _FIXED.unpack_from(view, 0)
    if magic != MAGIC:
        raise CodecError(f"bad magic {bytes(magic)!r}, expected {MAGIC!r}: not a sparse codec frame")
    if version != VERSION:
        raise CodecError(f"unsupported sparse format version {version} (this build reads version {VERSION})")
    if not MIN_BITS <= bits <= MAX_BITS:
        raise CodecError(f"bits per value {bits} outside {MIN_BITS}..{MAX_BITS}")
    if not 1 <= chunk <= MAX_CHUNK:
        raise CodecError(f"chunk size {chunk} outside 1..{MAX_CHUNK}")
    shape = read_shape(view, FIXED_HEADER_BYTES, dtype_code, ndim, max_elements)
    numel = math.prod(shape)
    if entries > numel:
        raise CodecError(f"{entries} entries declared for a tensor of {numel} values")
    n_chunks = -(-numel // chunk)
    scales_at = FIXED_HEADER_BYTES + 8 * ndim
    payload_at = scales_at + SCALE_BYTES * n_chunks
    expected = payload_at + payload_bytes + CRC_BYTES
    if size != expected:
        raise CodecError(f"frame is {size} bytes, the header declares {expected}")
    stored = int.from_bytes(view[size - CRC_BYTES:], "little")
    if stored != checksum(view[:size - CRC_BYTES]):
        raise CodecError("checksum mismatch")
    if numel == 0 and payload_bytes != 0:
        raise CodecError(f"an empty tensor carries no payload, but payload_bytes = {payload_bytes}")
    if numel and bytes(view[payload_at:payload_at + 4]) != ZSTD_MAGIC:
        raise CodecError("payload is not a zstd frame (bad zstd magic)")
    return (CODE_DTYPES[dtype_code], tuple(shape), numel, bits, chunk, entries, n_chunks,
            view[scales_at:payload_at], view[payload_at:payload_at + payload_bytes])


def _decompress(payload: memoryview, size: int) -> bytes:
    try:
        params = zstandard.get_frame_parameters(payload)
    except zstandard.ZstdError as e:
        raise CodecError(f"payload has no valid zstd frame header ({e})") from None
    if params.content_size != size:
        raise CodecError(f"zstd frame declares {params.content_size} bytes of content, the header needs {size}")
    if params.dict_id != 0:
        raise CodecError(f"zstd frame needs dictionary {params.dict_id}; the codec uses none")
    try:
        raw = _zstd(1)[1].decompress(payload, max_output_size=size, allow_extra_data=False)
    except zstandard.ZstdError as e:
        raise CodecError(f"payload does not decompress: {e}") from None
    if len(raw) != size:
        raise CodecError(f"payload holds {len(raw)} bytes, the header needs {size}")
    return raw


SLICE_ENTRIES = 1 << 18
"""Entries decoded at a time (whole chunks): the decoder's int64 temporaries stay near 20 MB whatever the frame, so a
small frame declaring a dense tensor cannot make a peer allocate tens of bytes per value."""


def decode_sparse(data, *, max_elements: int, out: torch.Tensor | None = None,
                  expect: tuple[int, int | None, int] | None = None) -> torch.Tensor:
    """The tensor a sparse frame holds (its dtype and shape; unsent entries are 0). Raises CodecError, and only
    that, for bad input; nothing beyond `max_elements` values is allocated or decompressed.

    `expect`: (chunk_size, k, bits) the swarm's spec sets: a frame with another chunk size or bit width, or more than
    k entries in a chunk (k None: no bound), is refused before anything is decompressed."""
    if not isinstance(max_elements, int) or max_elements < 0:
        raise ValueError(f"max_elements must be a non-negative integer, got {max_elements!r}")
    try:
        view = memoryview(data).cast("B")
    except (TypeError, ValueError, BufferError):
        raise CodecError(f"a frame must be bytes-like, got {type(data).__name__}") from None
    dtype, shape, numel, bits, chunk, entries, n_chunks, scale_view, payload = _header(view, max_elements)
    if expect is not None:
        want_chunk, want_k, want_bits = expect
        if (chunk, bits) != (want_chunk, want_bits):
            raise CodecError(f"frame of chunk size {chunk} at {bits} bits, the swarm's codec sends chunks of "
                             f"{want_chunk} at {want_bits} bits")
        if want_k is not None and entries > want_k * n_chunks:
            raise CodecError(f"{entries} entries in {n_chunks} chunks, the swarm's codec sends at most {want_k} each")
    if out is not None and (out.dtype != dtype or tuple(out.shape) != shape or not out.is_contiguous()):
        raise CodecError(f"frame holds {dtype} {shape}, out is {out.dtype} {tuple(out.shape)}")
    result = torch.zeros(numel, dtype=torch.float32)
    if numel:
        _fill(result, payload, scale_view, dtype, numel, bits, chunk, entries, n_chunks,
              None if expect is None else expect[1])
    result = result.view(shape)
    if out is not None:
        out.copy_(result)
        return out
    return result if dtype == torch.float32 else result.to(dtype)


def _fill(result: torch.Tensor, payload: memoryview, scale_view: memoryview, dtype: torch.dtype, numel: int,
          bits: int, chunk: int, entries: int, n_chunks: int, k: int | None) -> None:
    """Check the payload and scatter its values into `result`, SLICE_ENTRIES entries (whole chunks) at a time."""
    code_bytes = -(-entries * bits // 8)
    raw = _decompress(payload, 2 * n_chunks + 2 * entries + code_bytes)
    counts = np.frombuffer(raw, dtype="<u2", count=n_chunks).astype(np.int64)
    if int(counts.sum()) != entries:
        raise CodecError(f"chunk counts add up to {int(counts.sum())}, the header declares {entries} entries")
    lengths = np.full(n_chunks, chunk, dtype=np.int64)
    lengths[-1] = numel - (n_chunks - 1) * chunk
    limits = lengths if k is None else np.minimum(lengths, k)
    if bool((counts > limits).any()):
        c = int(np.argmax(counts > limits))
        raise CodecError(f"chunk {c} declares {int(counts[c])} entries, at most {int(limits[c])} may be sent")
    if entries * bits % 8 and raw[-1] & ((1 << (8 - entries * bits % 8)) - 1):
        raise CodecError("padding bits after the last value code are not zero")
    scales = torch.from_numpy(np.frombuffer(scale_view, dtype=np.int16).copy()).view(torch.bfloat16).float()
    lo, hi = scales[0::2], scales[1::2]
    limit = _bf16_limit(dtype)
    if not bool(torch.isfinite(scales).all()) or bool((lo < 0).any() | (hi < lo).any() | (hi > limit).any()):
        raise CodecError(f"chunk scales must be finite with 0 <= lo <= hi <= {limit:g}")
    at = 2 * n_chunks
    low = np.frombuffer(raw, np.uint8, entries, at)
    high = np.frombuffer(raw, np.uint8, entries, at + entries)
    packed = np.concatenate((np.frombuffer(raw, np.uint8, code_bytes, at + 2 * entries), np.zeros(1, np.uint8)))
    ends = np.cumsum(counts)
    c0 = 0
    while c0 < n_chunks:
        # the chunks [c0, c1) hold at most SLICE_ENTRIES entries (or one chunk, up to 65535)
        e0 = int(ends[c0] - counts[c0])
        c1 = max(c0 + 1, int(np.searchsorted(ends, e0 + SLICE_ENTRIES, side="right")))
        e1 = int(ends[c1 - 1])
        if e1 > e0:
            _scatter(result, low[e0:e1], high[e0:e1], _codes(packed, e0, e1, bits), counts[c0:c1], lengths[c0:c1],
                     c0, chunk, lo, hi, bits)
        c0 = c1


def _scatter(result: torch.Tensor, low: np.ndarray, high: np.ndarray, codes: np.ndarray, counts: np.ndarray,
             lengths: np.ndarray, c0: int, chunk: int, lo: torch.Tensor, hi: torch.Tensor, bits: int) -> None:
    dist = low.astype(np.int64) | (high.astype(np.int64) << 8)
    chunk_of = np.repeat(np.arange(c0, c0 + len(counts), dtype=np.int64), counts)
    starts = np.cumsum(counts) - counts
    first = np.zeros(len(dist), dtype=bool)
    first[starts[counts > 0]] = True
    if bool((dist[~first] < 1).any()):
        raise CodecError("positions within a chunk must increase strictly (a repeated or unsorted position)")
    total = np.cumsum(dist)
    before = np.concatenate((np.zeros(1, dtype=np.int64), total))  # before[i]: distances ahead of entry i
    positions = total - np.repeat(before[starts], counts)
    outside = positions >= np.repeat(lengths, counts)
    if bool(outside.any()):
        i = int(np.argmax(outside))
        raise CodecError(f"position {int(positions[i])} outside chunk {int(chunk_of[i])}")
    result[torch.from_numpy(chunk_of * chunk + positions)] = _levels(codes, chunk_of, lo, hi, bits)
