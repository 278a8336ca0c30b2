"""Codecs behind one interface (compression/base.py) and one table (compression/registry.py): every registered codec
round-trips, the spec names only registered kinds and builds its codecs from the table, `max_frame_bytes` bounds
real worst-case frames, and adding a codec is one class and one table entry."""

from __future__ import annotations

import struct
from typing import Any, ClassVar

import pytest
import torch

from pathswarm.compression import (
    CODECS,
    Codec,
    CodecError,
    ErrorFeedback,
    Int8Codec,
    SparseCodec,
    codec_class,
    codec_kinds,
)
from pathswarm.protocol.spec import CodecSpec, RouterSpec, SpecError, SwarmSpec, loads_spec


def specs_of_every_kind() -> list[CodecSpec]:
    return [CodecSpec(kind=kind) for kind in codec_kinds()]


def codecs_of_every_kind() -> list[Codec]:
    return [c for spec in specs_of_every_kind() for c in (spec.contribution_codec(), spec.mean_codec())]


@pytest.mark.parametrize("codec", codecs_of_every_kind(), ids=repr)
@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16))
@pytest.mark.parametrize("shape", ((0,), (1,), (3, 1000), (5000,)))
def test_every_registered_codec_decodes_what_its_encoder_says_a_peer_decodes(codec, dtype, shape):
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(1)) * 1e-2).to(dtype)
    flat = x.reshape(-1).contiguous()
    frame, decoded = codec.encode_values(flat, tuple(shape), dtype, want_decoded=True)
    assert frame == codec.encode(x)  # the same bytes either way
    out = codec.decode(frame, max_elements=x.numel())
    assert out.shape == x.shape and out.dtype == dtype
    assert torch.equal(out.reshape(-1).float(), decoded.float())
    if x.numel() and codec.name == "int8":
        assert (out.double() - x.double()).norm() <= 0.02 * x.double().norm()
    with pytest.raises(CodecError):
        codec.decode(frame[:-1], max_elements=x.numel())


def test_the_spec_builds_the_codecs_it_built_before_the_table():
    spec = CodecSpec(block_size=64, zstd_level=3, target_error=0.02)
    assert spec.contribution_codec() == spec.mean_codec() == Int8Codec(64, 3, 0.02)
    sparse = CodecSpec(kind="sparse", chunk_size=128, k_per_chunk=5, value_bits=3, mean_bits=6, zstd_level=2)
    assert sparse.contribution_codec() == SparseCodec(128, 5, 3, 2)
    assert sparse.mean_codec() == SparseCodec(128, None, 6, 2)
    assert not CodecSpec().feedback_in_weights and CodecSpec(kind="sparse").feedback_in_weights


def test_an_unknown_kind_is_a_clear_error_naming_the_known_kinds():
    with pytest.raises(SpecError, match=r"codec\.kind: unknown codec 'zip' \(known: int8, sparse\)"):
        CodecSpec(kind="zip").validate()
    with pytest.raises(SpecError, match=r"known: int8, sparse"):
        loads_spec('levels = [1]\n[codec]\nkind = "zip"\n[router]\nfeatures = 1\ncentroids = [[1.0]]\n')
    with pytest.raises(ValueError, match=r"unknown codec kind 'zip' \(known: int8, sparse\)"):
        codec_class("zip")


def incompressible(n: int, seed: int) -> torch.Tensor:
    """Uniform values: every int8 level and every sparse code about equally likely, so zstd gains nothing."""
    return torch.rand(n, generator=torch.Generator().manual_seed(seed)) * 2 - 1


BOUNDED = codecs_of_every_kind() + [Int8Codec(1, 1, 0.0), Int8Codec(256, 19, 0.0, 2), SparseCodec(64, 64, 8),
                                    SparseCodec(1, None, 8), SparseCodec(65535, None, 2)]


@pytest.mark.parametrize("codec", BOUNDED, ids=repr)
def test_max_frame_bytes_bounds_real_frames_of_incompressible_values(codec):
    for n in (0, 1, 1000, 300_000):
        x = incompressible(n, n)
        assert len(codec.encode(x)) <= codec.max_frame_bytes(n), n
        assert len(codec.encode(x.half())) <= codec.max_frame_bytes(n), n
    deep = incompressible(4096, 7).reshape((1,) * 63 + (4096,))  # the largest shape a frame can declare
    assert len(codec.encode(deep)) <= codec.max_frame_bytes(4096)


def test_the_spec_bounds_both_frames_of_a_round_and_the_int8_bound_is_tight():
    n = 300_000
    for spec in specs_of_every_kind():
        x = incompressible(n, 3)
        assert len(spec.contribution_codec().encode(x)) <= spec.max_contribution_bytes(n) <= spec.max_frame_bytes(n)
        assert len(spec.mean_codec().encode(x)) <= spec.max_mean_bytes(n) <= spec.max_frame_bytes(n)
    # int8 is ~1 byte per value, its scales and headers: the bound stays within a few % of that
    assert CodecSpec().max_frame_bytes(n) <= 1.03 * n + 8192


# ---- adding a codec: one class, one entry -------------------------------------------------------
class Fp16Codec(Codec):
    """A trivial codec: the values as float16, behind a magic, the number of dimensions and the shape."""

    name: ClassVar[str] = "fp16"

    def check(self, tensor: torch.Tensor) -> None:
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            raise ValueError("fp16 encodes float tensors")

    def encode_values(self, flat, shape, dtype, want_decoded=False):
        half = flat.to(torch.float16)
        frame = b"FP16" + struct.pack(f"<B{len(shape)}Q", len(shape), *shape) + half.numpy().tobytes()
        return frame, (half.float() if want_decoded else None)

    def decode(self, data: Any, max_elements: int) -> torch.Tensor:
        data = bytes(data)
        if data[:4] != b"FP16" or len(data) < 5 or len(data) < 5 + 8 * data[4]:
            raise CodecError("not an fp16 frame")
        shape = struct.unpack_from(f"<{data[4]}Q", data, 5)
        numel = int(torch.Size(shape).numel())
        if numel > max_elements or len(data) != 5 + 8 * len(shape) + 2 * numel:
            raise CodecError("fp16 frame of the wrong size")
        return torch.frombuffer(bytearray(data[5 + 8 * len(shape):]), dtype=torch.float16).float().reshape(shape)

    def max_frame_bytes(self, numel: int) -> int:
        return 5 + 8 * 64 + 2 * numel


@pytest.fixture
def fp16_registered(monkeypatch):
    monkeypatch.setitem(CODECS, Fp16Codec.name, Fp16Codec)  # the one entry; removed after the test


def test_a_codec_is_one_class_and_one_table_entry(fp16_registered):
    router = RouterSpec(features=1, centroids=((1.0,),))
    spec = loads_spec(SwarmSpec(levels=(1,), router=router, codec=CodecSpec(kind="fp16")).to_toml())
    assert spec.codec.kind == "fp16" and codec_kinds() == ("fp16", "int8", "sparse")
    codec = spec.codec.contribution_codec()
    assert isinstance(codec, Fp16Codec) and isinstance(spec.codec.mean_codec(), Fp16Codec)
    assert not spec.codec.feedback_in_weights  # the base class's choice: error feedback in a buffer
    x = torch.randn(3, 40)
    frame = codec.encode(x)
    assert len(frame) <= spec.codec.max_frame_bytes(x.numel())
    assert torch.equal(codec.decode(frame, max_elements=120), x.half().float())
    feedback = ErrorFeedback()
    sent = codec.decode(feedback.encode(x, codec), 120) + codec.decode(feedback.encode(x, codec), 120)
    assert torch.allclose(sent.reshape(-1) + feedback.residual, 2 * x.reshape(-1), atol=1e-6)


def test_a_codec_leaves_the_table_with_its_entry():
    assert "fp16" not in CODECS
    with pytest.raises(SpecError, match="unknown codec 'fp16'"):
        CodecSpec(kind="fp16").validate()
