"""decode against hostile bytes: random strings and random mutations of valid frames (with and without
a recomputed checksum) raise CodecError and nothing else, and whatever decodes is finite and bounded.
A bounded sample here; benchmarks/codec.py decodes a million mutated frames."""

from __future__ import annotations

import struct

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pathswarm.compression import CodecError, decode, encode
from pathswarm.compression.frame import MAGIC, checksum

MAX_ELEMENTS = 100_000
FUZZ = settings(max_examples=300, deadline=None)

_gen = torch.Generator().manual_seed(0)
FRAMES = [
    encode(torch.randn(300, generator=_gen) * 1e-3),
    encode(torch.randn(7, 33, generator=_gen).half(), block_size=16),
    encode(torch.randn(2, 3, 5, generator=_gen).bfloat16(), block_size=4, target_error=0.0),
    encode(torch.tensor(2.5)),
    encode(torch.zeros(0, 3)),
    encode(torch.randn(5000, generator=_gen) * 1e-2, block_size=512),
]
INTERESTING = [0, 1, 2, 3, 0x7F, 0x80, 0xFF, 0xFFFF, 1 << 20, (1 << 31) - 1, 1 << 32, (1 << 63) - 1, (1 << 64) - 1]


def decode_or_codec_error(data: bytes) -> torch.Tensor | None:
    """decode's result, or None when it raised CodecError; any other exception fails the test."""
    try:
        y = decode(data, max_elements=MAX_ELEMENTS)
    except CodecError as e:
        assert str(e), "a CodecError must say what was wrong"
        return None
    assert y.numel() <= MAX_ELEMENTS
    assert torch.isfinite(y).all()
    return y


def reseal(body: bytearray) -> bytes:
    body = bytes(body[:-4])
    return body + checksum(body).to_bytes(4, "little")


@st.composite
def mutated_frames(draw) -> bytes:
    frame = bytearray(draw(st.sampled_from(FRAMES)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "byte", "truncate", "insert", "delete", "field"]))
        at = draw(st.integers(0, max(0, len(frame) - 1)))
        if kind == "flip" and frame:
            frame[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "byte" and frame:
            frame[at] = draw(st.integers(0, 255))
        elif kind == "truncate":
            del frame[at:]
        elif kind == "insert":
            frame[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del frame[at:at + draw(st.integers(1, 16))]
        elif kind == "field" and len(frame) >= 36:
            # A header field (version, dtype, ndim, flags, block size, payload length, dims) set to an edge value.
            offset, fmt = draw(st.sampled_from([(4, "<B"), (5, "<B"), (6, "<B"), (7, "<B"), (8, "<I"),
                                                (12, "<Q"), (20, "<Q"), (28, "<Q")]))
            value = draw(st.sampled_from(INTERESTING)) % (1 << (8 * struct.calcsize(fmt)))
            struct.pack_into(fmt, frame, offset, value)
    if draw(st.booleans()) and len(frame) >= 4:
        return reseal(frame)
    return bytes(frame)


def test_the_unmutated_frames_decode():
    for frame in FRAMES:
        assert decode_or_codec_error(frame) is not None


@FUZZ
@given(st.binary(max_size=600))
def test_random_bytes_raise_codec_error(data):
    assert decode_or_codec_error(data) is None


@FUZZ
@given(st.binary(max_size=400))
def test_random_bytes_behind_a_valid_magic_and_checksum(body):
    decode_or_codec_error(reseal(bytearray(MAGIC + b"\x01" + body + bytes(4))))


@FUZZ
@given(mutated_frames())
def test_mutated_frames_raise_only_codec_error(data):
    decode_or_codec_error(data)
