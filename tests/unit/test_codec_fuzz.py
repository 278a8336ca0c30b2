"""decode against hostile bytes: random strings and random mutations of valid frames (with and without
a recomputed checksum) raise CodecError and nothing else, and whatever decodes is finite and bounded.
The frames, their mutations and decode's contract are tests/fuzzing.py's; a bounded sample here,
benchmarks/codec.py decodes a million mutated frames."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pathswarm.compression.frame import MAGIC, checksum

from ..fuzzing import BY_NAME, FRAMES, mutate_frame, outcome

FUZZ = settings(max_examples=300, deadline=None)
DECODE = BY_NAME["compression.decode"]


def reseal(body: bytearray) -> bytes:
    body = bytes(body[:-4])
    return body + checksum(body).to_bytes(4, "little")


def test_the_unmutated_frames_decode():
    for frame in FRAMES:
        assert outcome(DECODE, frame) == ("accepted", None)


@FUZZ
@given(st.binary(max_size=600))
def test_random_bytes_raise_codec_error(data):
    assert outcome(DECODE, data)[0] == "typed_error"


@FUZZ
@given(st.binary(max_size=400))
def test_random_bytes_behind_a_valid_magic_and_checksum(body):
    outcome(DECODE, reseal(bytearray(MAGIC + b"\x01" + body + bytes(4))))


@FUZZ
@given(st.randoms(use_true_random=False))
def test_mutated_frames_raise_only_codec_error(rng):
    outcome(DECODE, mutate_frame(rng.choice(FRAMES), rng))
