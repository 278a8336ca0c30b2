"""The outer-gradient codec: round-trip error, the exact frame layout, every bad-input case, the fast
path against the float64 reference, and error feedback. (Random bytes and mutations: test_codec_fuzz.py.)"""

from __future__ import annotations

import math
import struct

import pytest
import torch
import zstandard
from torch.distributions import Laplace, StudentT

from pathswarm.compression import CodecError, ErrorFeedback, Int8Codec, decode, encode
from pathswarm.compression.frame import FIXED_HEADER_BYTES, checksum
from pathswarm.compression.quantize import dequantize, quantize, scale_limit

from .codec_reference import bf16_ceil, dequantize_reference, quantize_reference

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INT8 = Int8Codec()
"""The int8 codec with encode's defaults (what error feedback encodes with below)."""


def rel_l2(decoded: torch.Tensor, true: torch.Tensor) -> float:
    return ((decoded.double() - true.double()).norm() / true.double().norm()).item()


def reseal(body: bytes | bytearray) -> bytes:
    """A frame with its checksum recomputed: reaches the checks behind the CRC."""
    body = bytes(body[:-4])
    return body + checksum(body).to_bytes(4, "little")


def samples(kind: str, n: int, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    if kind == "gaussian":
        return torch.randn(n) * 1e-3
    if kind == "laplace":
        return Laplace(0.0, 1e-3).sample((n,))
    return StudentT(5.0).sample((n,)) * 1e-3  # "student5"


# ---- round trips ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["gaussian", "laplace", "student5"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_error_within_one_and_a_half_percent(kind, dtype):
    x = samples(kind, 200_003).to(dtype)
    frame = encode(x)
    y = decode(frame)
    assert y.dtype == dtype and y.shape == x.shape
    assert rel_l2(y, x) <= 0.015
    assert len(frame) < 0.23 * 4 * x.numel()


def test_plain_absmax_is_finer_and_larger():
    x = samples("gaussian", 100_000)
    fine, default = encode(x, target_error=0.0), encode(x)
    assert rel_l2(decode(fine), x) < 0.008 < rel_l2(decode(default), x)
    assert len(default) < 0.92 * len(fine)


def test_quiet_blocks_are_coarsened_but_never_erased():
    torch.manual_seed(0)
    loud, quiet = torch.randn(2560), torch.randn(25600) * 1e-3  # the loud part dominates the tensor's rms
    y = decode(encode(torch.cat([loud, quiet])))
    assert rel_l2(y, torch.cat([loud, quiet])) <= 0.015
    per_block = [rel_l2(y[2560 + i:2560 + i + 256], quiet[i:i + 256]) for i in range(0, 25600, 256)]
    assert 0.02 < max(per_block) <= 0.055  # coarser than the target, capped at 5 % (BLOCK_ERROR_CAP)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (1,), (255,), (256,), (257,), (7, 300), (2, 3, 4, 5)])
def test_shapes_and_dtypes_round_trip(shape, dtype):
    x = (torch.randn(shape) * 1e-2).to(dtype)
    y = decode(encode(x, block_size=64))
    assert y.shape == x.shape and y.dtype == dtype
    if x.numel():
        step = x.abs().max().double() * 0.06  # no value moves more than half a (coarsest) step
        assert (y.double() - x.double()).abs().max() <= step


@pytest.mark.parametrize("block_size", [1, 3, 256, 4096])
def test_block_sizes_including_larger_than_the_tensor(block_size):
    x = samples("gaussian", 1000)
    assert rel_l2(decode(encode(x, block_size=block_size)), x) <= 0.015


def test_non_contiguous_inputs():
    base = torch.randn(300, 200)
    for x in (base.t(), base[::3, 1::2], base[:, 5], torch.randn(2000)[::2]):
        assert not x.is_contiguous()
        y = decode(encode(x))
        assert y.shape == x.shape and rel_l2(y, x) <= 0.015


def test_zeros_constants_and_tiny_values_need_no_division_by_zero():
    assert torch.equal(decode(encode(torch.zeros(1000))), torch.zeros(1000))
    for c in (3.7, -1e-30, 65000.0):
        y = decode(encode(torch.full((500,), c)))
        assert (y - c).abs().max() <= 0.025 * abs(c)
    # Scales stay >= float32's smallest normal number, so denormals round to within half of it.
    x = torch.tensor([1e-42, 1e-40, -3e-41, 0.0, 2e-39])
    y = decode(encode(x))
    assert torch.isfinite(y).all() and (y - x).abs().max() <= torch.finfo(torch.float32).tiny / 2


@pytest.mark.parametrize("dtype", DTYPES)
def test_largest_finite_values_saturate_instead_of_overflowing(dtype):
    big = torch.finfo(dtype).max
    x = torch.tensor([big, -big, 1.0, 0.5 * big], dtype=dtype)
    y = decode(encode(x))
    assert torch.isfinite(y).all()
    assert (y.double() - x.double()).abs().max() <= 0.02 * big
    assert y[0] > 0 > y[1]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_encode_refuses_nan_and_inf(dtype, bad):
    x = torch.randn(1000).to(dtype)
    x[700] = bad
    with pytest.raises(ValueError, match="NaN or Inf.*elements 512..767"):
        encode(x)


@pytest.mark.parametrize("kwargs, match", [
    (dict(block_size=0), "block_size"), (dict(block_size=1 << 21), "block_size"),
    (dict(zstd_level=0), "zstd_level"), (dict(zstd_level=23), "zstd_level"),
    (dict(target_error=-0.1), "target_error"), (dict(target_error=math.nan), "target_error"),
    (dict(zstd_threads=-1), "zstd_threads"),
])
def test_encode_checks_its_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        encode(torch.randn(10), **kwargs)


def test_encode_refuses_non_float_tensors():
    for x in (torch.arange(10), torch.zeros(3, dtype=torch.float64), [1.0, 2.0]):
        with pytest.raises(ValueError, match="float32, float16 or bfloat16|torch.Tensor"):
            encode(x)


def test_zstd_threads_give_the_same_values():
    x = samples("gaussian", 300_000)
    assert torch.equal(decode(encode(x, zstd_threads=2)), decode(encode(x)))


def test_decode_into_out():
    x = samples("gaussian", 5000).view(50, 100)
    out = torch.empty(50, 100)
    assert decode(encode(x), out=out) is out
    assert torch.equal(out, decode(encode(x)))
    with pytest.raises(CodecError, match="out is torch.float32 \\(5000,\\)"):
        decode(encode(x), out=torch.empty(5000))
    with pytest.raises(ValueError, match="contiguous"):
        decode(encode(x), out=torch.empty(100, 50).t())


# ---- the frame layout -------------------------------------------------------------------------
GOLDEN = bytes.fromhex(
    "50535751" "01" "01" "02" "00" "04000000" "0f00000000000000"  # magic, version, fp32, ndim 2, flags, bs 4, 15
    "0200000000000000" "0300000000000000"  # shape (2, 3)
    "023c" "823c"  # scales: bfloat16 0x3c02 = 1/126.03, 0x3c82 = 2/126.03
    "28b52ffd" "2006" "310000" "3f822000" "7ef8"  # zstd: header, content size 6, raw block [63 -126 32 0 126 -8]
    "6d3fb194"  # CRC-32
)


def test_golden_frame_layout():
    x = torch.tensor([[0.5, -1.0, 0.25], [0.0, 2.0, -0.125]])
    frame = encode(x, block_size=4, target_error=0.0)
    assert frame == GOLDEN
    magic, version, dtype, ndim, flags, block_size, payload_bytes = struct.unpack_from("<4sBBBBIQ", frame)
    assert (magic, version, dtype, ndim, flags, block_size) == (b"PSWQ", 1, 1, 2, 0, 4)
    assert struct.unpack_from("<2Q", frame, FIXED_HEADER_BYTES) == (2, 3)
    scales = torch.frombuffer(bytearray(frame[36:40]), dtype=torch.bfloat16).float()
    assert scales.tolist() == [bf16_ceil(torch.tensor([1 / 127.0], dtype=torch.float64)).item(),
                               bf16_ceil(torch.tensor([2 / 127.0], dtype=torch.float64)).item()]
    payload = frame[40:40 + payload_bytes]
    assert list(zstandard.ZstdDecompressor().decompress(payload)) == [63, 256 - 126, 32, 0, 126, 256 - 8]
    assert int.from_bytes(frame[-4:], "little") == checksum(frame[:-4])
    expected = torch.tensor([63, -126, 32, 0, 126, -8]) * scales.repeat_interleave(4)[:6]
    assert torch.equal(decode(frame).view(-1), expected)


# ---- every bad-input case gives a CodecError that says what is wrong ---------------------------
@pytest.fixture(scope="module")
def frame() -> bytes:
    return encode(samples("gaussian", 1000).view(10, 100), block_size=256)


def patched(frame: bytes, offset: int, fmt: str, value) -> bytes:
    body = bytearray(frame)
    struct.pack_into(fmt, body, offset, value)
    return reseal(body)


def test_truncated_frames(frame):
    for cut in (0, 3, 19, 23, 30, 36, 40, 100, len(frame) - 5, len(frame) - 1):
        with pytest.raises(CodecError, match="truncated"):
            decode(frame[:cut])


def test_extended_frames(frame):
    for extra in (b"\x00", b"garbage" * 10):
        with pytest.raises(CodecError, match="extended.*trailing"):
            decode(frame + extra)


@pytest.mark.parametrize("offset, fmt, value, match", [
    (0, "<4s", b"PSWX", "bad magic"),
    (4, "<B", 2, "unsupported format version 2"),
    (5, "<B", 9, "unknown dtype code 9"),
    (6, "<B", 65, "ndim 65 exceeds"),
    (7, "<B", 1, "reserved flags"),
    (8, "<I", 0, "block size 0"),
    (8, "<I", (1 << 20) + 1, "block size"),
])
def test_bad_header_fields(frame, offset, fmt, value, match):
    with pytest.raises(CodecError, match=match):
        decode(patched(frame, offset, fmt, value))


def test_checksum_mismatch(frame):
    for offset in (37, 44, 60, len(frame) // 2, len(frame) - 5, len(frame) - 1):  # scales, payload, CRC
        body = bytearray(frame)
        body[offset] ^= 0x10
        with pytest.raises(CodecError, match="checksum mismatch"):
            decode(bytes(body))


def test_declared_size_above_max_elements_is_refused_before_any_work(frame):
    with pytest.raises(CodecError, match="1000 elements, more than max_elements = 999"):
        decode(frame, max_elements=999)
    assert decode(frame, max_elements=1000).numel() == 1000
    # A tiny frame declaring 2^62 values: refused from the header alone, nothing allocated.
    bomb = patched(patched(frame, 20, "<Q", 1 << 31), 28, "<Q", 1 << 31)
    with pytest.raises(CodecError, match="more than max_elements"):
        decode(bomb)
    with pytest.raises(CodecError, match="empty shape"):
        decode(patched(patched(frame, 20, "<Q", 0), 28, "<Q", 1 << 62))


def test_shape_that_disagrees_with_the_payload(frame):
    # (10, 100) -> (10, 102): same number of 256-blocks, so the frame length still matches.
    with pytest.raises(CodecError, match="declares 1000 bytes of content, the shape needs 1020"):
        decode(patched(frame, 28, "<Q", 102))
    # Fewer values than blocks: the frame length no longer matches the header.
    with pytest.raises(CodecError, match="truncated|extended"):
        decode(patched(frame, 20, "<Q", 2))


@pytest.mark.parametrize("bits, match", [
    (0x7FC0, "not finite"), (0x7F80, "not finite"), (0xFF80, "not finite"),
    (0xBC00, "negative"), (0x7F00, "larger than"),
])
def test_bad_scales(frame, bits, match):
    with pytest.raises(CodecError, match=f"scale of block 2 is .*{match}"):
        decode(patched(frame, 36 + 2 * 2, "<H", bits))


def test_scale_that_would_overflow_float16():
    frame = encode(torch.randn(100).half())
    assert scale_limit(torch.float16) == 510.0
    with pytest.raises(CodecError, match="overflow torch.float16"):
        decode(patched(frame, 28, "<H", 0x4400))  # 512.0: 128 * 512 is Inf in float16


def test_payload_that_is_not_zstd_or_does_not_decompress(frame):
    start = FIXED_HEADER_BYTES + 16 + 2 * 4
    with pytest.raises(CodecError, match="not a zstd frame"):
        decode(patched(frame, start, "<I", 0xDEADBEEF))
    body = bytearray(frame)
    body[start + 12:start + 40] = bytes(28)  # garble the compressed block, keep the zstd header
    with pytest.raises(CodecError, match="does not decompress"):
        decode(reseal(body))


def test_zstd_frame_without_content_size_or_with_extra_data(frame):
    x = samples("gaussian", 1000)
    q, scales = quantize(x, 256, 0.013, scale_limit(torch.float32))
    head = frame[:FIXED_HEADER_BYTES + 16 + 8]

    def with_payload(payload: bytes) -> bytes:
        body = bytearray(head + payload + bytes(4))
        struct.pack_into("<Q", body, 12, len(payload))
        struct.pack_into("<2Q", body, 20, 1000, 1)
        return reseal(body)

    no_size = zstandard.ZstdCompressor(write_content_size=False).compress(q.numpy()[:1000].tobytes())
    with pytest.raises(CodecError, match="does not declare its content size"):
        decode(with_payload(no_size))
    good = zstandard.ZstdCompressor().compress(q.numpy()[:1000].tobytes())
    assert decode(with_payload(good)).shape == (1000, 1)
    with pytest.raises(CodecError, match="unused data"):
        decode(with_payload(good + b"tail"))


def test_empty_tensor_frame_carrying_a_payload():
    frame = encode(torch.zeros(0, 5))
    with pytest.raises(CodecError, match="empty tensor carries no payload"):
        decode(patched(frame[:-4] + bytes(8) + bytes(4), 12, "<Q", 8))


def test_not_bytes_like():
    for data in ("text", None, 12, [1, 2]):
        with pytest.raises(CodecError, match="bytes-like"):
            decode(data)
    assert decode(bytearray(GOLDEN)).shape == (2, 3)
    assert decode(memoryview(GOLDEN)).shape == (2, 3)


def test_bad_max_elements_is_a_caller_error(frame):
    with pytest.raises(ValueError, match="max_elements"):
        decode(frame, max_elements=-1)


# ---- the fast path against the float64 reference ----------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, block_size, target_error", [(300_001, 256, 0.013), (50_000, 64, 0.0), (1000, 333, 0.02)])
def test_fast_path_matches_reference(n, block_size, target_error, dtype):
    x = samples("laplace", n, seed=n).to(dtype)
    limit = scale_limit(dtype)
    q, scales = quantize(x, block_size, target_error, limit)
    q_ref, scales_ref = quantize_reference(x, block_size, target_error, limit)
    q = q[:n]
    # Scales: equal but where float32 and float64 round a step differently across a bfloat16 boundary.
    same = scales == scales_ref
    assert same.float().mean() > 0.999
    assert ((scales - scales_ref).abs() <= scales_ref * 2 ** -7).all()
    # Values: equal wherever the scales are, but at rounding ties, where float32's x * (1 / s) and
    # float64's x / s may fall on either side of k + 1/2 (half inputs hit exact ties often).
    per_value = same.repeat_interleave(block_size)[:n]
    ratio = x.double() / scales_ref.double().repeat_interleave(block_size)[:n]
    near_tie = (ratio - ratio.floor() - 0.5).abs() < 1e-5
    diff = q.int() - q_ref.int()
    assert diff[per_value].abs().max() <= 1
    assert not (diff.ne(0) & per_value & ~near_tie).any()
    # Dequantisation is exact: int8 times a bfloat16 scale fits float32's mantissa.
    assert torch.equal(dequantize(q.numpy(), scales, block_size, n, dtype),
                       dequantize_reference(q, scales, block_size, dtype))


# ---- error feedback -----------------------------------------------------------------------------
def test_error_feedback_makes_the_sum_ten_times_more_accurate():
    torch.manual_seed(0)
    feedback = ErrorFeedback()
    true_sum, plain_sum, fed_sum = (torch.zeros(4096, dtype=torch.float64) for _ in range(3))
    for _ in range(200):
        x = torch.randn(4096) * 1e-3
        true_sum += x.double()
        plain_sum += decode(encode(x)).double()
        fed_sum += decode(feedback.encode(x, INT8)).double()
    plain, fed = rel_l2(plain_sum, true_sum), rel_l2(fed_sum, true_sum)
    assert fed * 10 <= plain, (fed, plain)
    # The errors telescope: what peers received misses the true sum by exactly the last residual.
    assert rel_l2(fed_sum + feedback.residual.double(), true_sum) < 1e-5


def test_error_feedback_with_half_precision_tracks_the_sum():
    feedback = ErrorFeedback()
    torch.manual_seed(1)
    true_sum, fed_sum = torch.zeros(1000, dtype=torch.float64), torch.zeros(1000, dtype=torch.float64)
    for _ in range(50):
        x = (torch.randn(1000) * 1e-2).half()
        true_sum += x.double()
        fed_sum += decode(feedback.encode(x, INT8)).double()
    assert rel_l2(fed_sum, true_sum) < 0.003


def test_error_feedback_keeps_its_residual_when_encoding_fails():
    feedback = ErrorFeedback()
    feedback.encode(torch.randn(100), INT8)
    before = feedback.residual.clone()
    with pytest.raises(ValueError, match="NaN"):
        feedback.encode(torch.full((100,), math.nan), INT8)
    assert torch.equal(feedback.residual, before)
    with pytest.raises(ValueError, match="one ErrorFeedback per module"):
        feedback.encode(torch.randn(99), INT8)


def test_error_feedback_does_not_modify_its_input_and_round_trips_its_state():
    x = torch.randn(500)
    copy = x.clone()
    feedback = ErrorFeedback()
    feedback.encode(x, INT8)
    feedback.encode(x, INT8)
    assert torch.equal(x, copy)
    restored = ErrorFeedback()
    restored.load_state_dict(feedback.state_dict())
    assert restored.encode(x, INT8) == feedback.encode(x, INT8)
    feedback.reset()
    assert feedback.residual is None and feedback.state_dict() == {}
