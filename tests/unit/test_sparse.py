"""The sparse codec (compression/sparse.py) and the round rule with `[codec] kind = "sparse"`: per-chunk top-k is
exactly the k largest magnitudes, values land within half a level, error feedback telescopes, malformed frames raise
CodecError naming the fault, and a sparse swarm's rounds keep replicas identical, pass honest audits and catch lies."""

from __future__ import annotations

import struct

import pytest
import torch
import zstandard

from pathswarm.compression import CodecError, ErrorFeedback, SparseCodec, encode_with
from pathswarm.compression.frame import checksum
from pathswarm.compression.sparse import decode_sparse
from pathswarm.node.train.round import make_contribution, settle
from pathswarm.protocol.rounds.frame_list import commit_frames, frame_hash
from pathswarm.protocol.rounds.outer import OuterState
from pathswarm.protocol.rounds.rule import audit_mean, close_round, encode_mean
from pathswarm.protocol.spec import CodecSpec, SpecError, SwarmSpec

SPEC = SwarmSpec(name="sparse", levels=(1,), codec=CodecSpec(kind="sparse", chunk_size=64, k_per_chunk=4))


def heavy(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g) * torch.rand(n, generator=g) ** 3


def test_each_chunk_sends_exactly_its_k_largest_magnitudes_within_half_a_level():
    x = heavy(1000, 0)  # 15 whole chunks of 64 and a ragged one of 40
    y = decode_sparse(encode_with(SparseCodec(64, 5, 3), x), max_elements=1000)
    for c in range(16):
        xs, ys = x[64 * c:64 * (c + 1)], y[64 * c:64 * (c + 1)]
        want = set(xs.abs().topk(5).indices.tolist())
        assert set(ys.nonzero().reshape(-1).tolist()) == want
        sent = sorted(want)
        assert torch.equal(torch.sign(ys[sent]), torch.sign(xs[sent]))
        mags = xs[sent].abs()
        level = float(mags.max() - mags.min()) / 3  # 3 bits: a sign and 4 magnitude levels
        # half a level, and the bfloat16 rounding of the chunk's end points (2^-8 relative)
        assert float((ys[sent].abs() - mags).abs().max()) <= level / 2 + float(mags.max()) / 128


def test_every_nonzero_entry_of_a_mean_is_sent_and_exact_zeros_never_are():
    x = heavy(5000, 1) * (torch.rand(5000, generator=torch.Generator().manual_seed(2)) < 0.05)
    y = decode_sparse(encode_with(SparseCodec(4096, None, 8), x), max_elements=5000)
    assert torch.equal(y != 0, x != 0)
    assert float((y - x).norm() / x.norm()) < 0.02  # 127 levels per chunk, like absmax int8
    assert torch.equal(decode_sparse(encode_with(SparseCodec(64, 8, 2), torch.zeros(300)), max_elements=300),
                       torch.zeros(300))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_what_the_encoder_expects_a_peer_to_decode_is_what_it_decodes(dtype):
    x = heavy(3000, 3).to(dtype).reshape(30, 100)
    codec = SparseCodec(256, 9, 4)
    frame, decoded = codec.encode_values(x.float().reshape(-1).contiguous(), tuple(x.shape), dtype,
                                         want_decoded=True)
    y = decode_sparse(frame, max_elements=3000)
    assert y.dtype == dtype and y.shape == x.shape
    assert torch.equal(decoded, y.float().reshape(-1))


def test_error_feedback_sends_everything_eventually():
    """Sum of what peers decoded = sum of the true tensors − the last residual (to float rounding)."""
    feedback, codec = ErrorFeedback(), SparseCodec(64, 4, 2)
    true, got = torch.zeros(640, dtype=torch.float64), torch.zeros(640, dtype=torch.float64)
    for r in range(30):
        x = heavy(640, 10 + r)
        true += x.double()
        got += decode_sparse(feedback.encode(x, codec=codec), max_elements=640).double()
    assert torch.allclose(got + feedback.residual.double(), true, atol=1e-5)
    # 1 in 16 entries per round at 2 bits, yet after 30 rounds most of the mass has arrived
    assert float(feedback.residual.norm()) < 0.5 * float(true.norm())


def craft(shape, chunk: int, bits: int, counts, distances, codes: bytes, scales, entries=None) -> bytes:
    """A sparse frame from its parts, with a valid checksum and payload length (tests/fuzzing.py mutates)."""
    body = struct.pack(f"<{len(counts)}H", *counts)
    body += bytes(d & 0xFF for d in distances) + bytes(d >> 8 for d in distances) + codes
    payload = zstandard.ZstdCompressor(write_content_size=True).compress(body)
    scale_bytes = torch.tensor(scales, dtype=torch.bfloat16).view(torch.int16).numpy().tobytes()
    head = struct.pack("<4sBBBBIQQ", b"PSWS", 1, 1, len(shape), bits, chunk,
                       sum(counts) if entries is None else entries, len(payload))
    frame = head + struct.pack(f"<{len(shape)}Q", *shape) + scale_bytes + payload
    return frame + checksum(frame).to_bytes(4, "little")


def test_a_crafted_valid_frame_decodes_to_its_values():
    # chunk 0: positions 1, 3 (distances 1, 2); chunk 1: position 0. 4 bits: a sign bit, then level m of 8
    # spanning lo..hi: codes 0x0 (+lo), 0xF (−hi), 0x8 (−lo).
    frame = craft((8,), 4, 4, [2, 1], [1, 2, 0], bytes([0x0F, 0x80]), [1.0, 8.0, 2.0, 2.0])
    assert decode_sparse(frame, max_elements=8).tolist() == [0, 1.0, 0, -8.0, -2.0, 0, 0, 0]


@pytest.mark.parametrize("parts, match", [
    (((8,), 4, 4, [2, 1], [1, 0, 0], bytes([0x0F, 0x80]), [1.0, 8.0, 2.0, 2.0]), "increase strictly"),
    (((8,), 4, 4, [2, 1], [3, 1, 0], bytes([0x0F, 0x80]), [1.0, 8.0, 2.0, 2.0]), "outside chunk"),
    (((6,), 4, 4, [1, 3], [0, 0, 1, 1], bytes([0x0F, 0x80]), [1.0, 8.0, 2.0, 2.0]), "declares 3 entries"),
    (((8,), 4, 4, [2, 1], [1, 2, 0], bytes([0x0F, 0x80]), [8.0, 1.0, 2.0, 2.0]), "scales"),
    (((8,), 4, 4, [2, 1], [1, 2, 0], bytes([0x0F, 0x80]), [1.0, float("inf"), 2.0, 2.0]), "scales"),
    (((8,), 4, 2, [2, 1], [1, 2, 0], bytes([0x0F]), [1.0, 8.0, 2.0, 2.0]), "padding bits"),
    (((8,), 4, 4, [2, 2], [1, 2, 0], bytes([0x0F, 0x80]), [1.0, 8.0, 2.0, 2.0], 3), "add up"),
])
def test_malformed_frames_raise_codec_error_naming_the_fault(parts, match):
    with pytest.raises(CodecError, match=match):
        decode_sparse(craft(*parts), max_elements=8)


def test_a_dense_frame_is_refused_by_a_sparse_swarm_and_decodes_in_bounded_memory():
    import tracemalloc

    n = 2_000_000
    dense = encode_with(SparseCodec(65535, None, 7), torch.ones(n))  # every value sent: a few KB of frame
    assert len(dense) < 20_000
    swarm = SparseCodec(4096, 41, 2)
    with pytest.raises(CodecError, match="chunk size 65535 at 7 bits"):
        swarm.decode(dense, n)
    forged = encode_with(SparseCodec(4096, 400, 2), torch.randn(n))  # the swarm's chunk and bits, 10x its k
    with pytest.raises(CodecError, match="at most 41 each"):
        swarm.decode(forged, n)
    # Decoded anyway (a mean may be dense): the decoder's own temporaries stay far below tens of bytes per value.
    tracemalloc.start()
    y = decode_sparse(dense, max_elements=n)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # numpy's share: the decompressed payload (~3 bytes per entry) and one slice's work; unsliced it was ~60 per entry
    assert bool((y == 1).all()) and peak < 4 * n + (24 << 20), peak


def test_huge_declared_sizes_are_refused_before_decompressing():
    huge = craft((1 << 40,), 4096, 2, [], [], b"", [])
    with pytest.raises(CodecError, match="max_elements"):
        decode_sparse(huge, max_elements=1 << 20)
    with pytest.raises(CodecError, match="not a sparse codec frame"):
        decode_sparse(encode_with(SparseCodec(4, 1, 2), torch.ones(3))[:4].replace(b"S", b"Q") + bytes(40),
                      max_elements=8)


def test_spec_checks_the_codec_table():
    with pytest.raises(SpecError, match="codec.kind"):
        CodecSpec(kind="top-k").validate()
    with pytest.raises(SpecError, match="k_per_chunk"):
        CodecSpec(kind="sparse", chunk_size=16, k_per_chunk=17).validate()
    with pytest.raises(SpecError, match="value_bits"):
        CodecSpec(kind="sparse", value_bits=1).validate()


def test_a_sparse_round_keeps_replicas_identical_and_its_audit_catches_a_lie():
    numel = 640
    start = OuterState(heavy(numel, 20), torch.zeros(numel), 3)
    members = {}
    for i, name in enumerate(("a", "b", "c")):
        state = OuterState(start.anchor.clone(), start.momentum.clone(), 3)
        local = start.anchor - 0.01 * heavy(numel, 30 + i)
        members[name] = (state, local, make_contribution(state, local, ErrorFeedback(), SPEC.codec, 100 * (i + 1)))
    frames = {n: (c.tokens, c.frame) for n, (_, _, c) in members.items()}
    closed = close_round([(n, t, f) for n, (t, f) in frames.items()], numel, SPEC, before=start)
    assert closed.used == ("a", "b", "c") and closed.mean_frame[:4] == b"PSWS"
    mean = decode_sparse(closed.mean_frame, max_elements=numel)
    # The mean's support is the union of the contributions' (each 4 of 64 per chunk), and no more.
    support = torch.zeros(numel, dtype=torch.bool)
    for _, f in frames.values():
        support |= decode_sparse(f, max_elements=numel) != 0
    assert bool((mean != 0).sum() > 4 * 10) and not bool(((mean != 0) & ~support).any())
    digests = set()
    for state, local, sent in members.values():
        done = settle(state, sent, local, "merged", 3, closed.mean_frame, closed.digest_after, SPEC.outer,
                      codec=SPEC.codec)
        assert done.applied and not done.diverged
        digests.add(done.state.digest())
    assert digests == {closed.digest_after}
    entries = [(n, t, frame_hash(f)) for n, (t, f) in frames.items()]
    listed, digest = [(n, t) for n, t, _ in entries], commit_frames(entries)
    assert audit_mean(frames, listed, digest, closed.mean_frame, numel, SPEC, 0.0) is None
    lie = encode_mean(-mean, SPEC.codec)
    assert "away from it" in audit_mean(frames, listed, digest, lie, numel, SPEC, 0.0)


def test_a_sparse_swarm_refuses_int8_frames_and_the_reverse():
    from pathswarm.compression import encode

    closed = close_round([("a", 10, encode(heavy(640, 40)))], 640, SPEC)
    assert closed.mean_frame == b"" and "undecodable" in closed.rejected[0][1]
    int8 = SwarmSpec(name="int8", levels=(1,))
    sparse_frame = encode_with(SparseCodec(64, 4, 2), heavy(640, 41))
    assert close_round([("a", 10, sparse_frame)], 640, int8).mean_frame == b""


def test_what_a_sparse_frame_did_not_carry_stays_in_the_local_weights_or_in_the_buffer():
    numel = 640
    start = OuterState(heavy(numel, 50), torch.zeros(numel), 3)
    local = start.anchor - 0.01 * heavy(numel, 51)
    for mode in ("weights", "buffer"):
        spec = SPEC.replace(codec=CodecSpec(kind="sparse", chunk_size=64, k_per_chunk=4, feedback=mode))
        state, feedback = OuterState(start.anchor.clone(), start.momentum.clone(), 3), ErrorFeedback()
        sent = make_contribution(state, local, feedback, spec.codec, 100)
        closed = close_round([("a", 100, sent.frame)], numel, spec, before=state)
        done = settle(state, sent, local, "alone", 3, closed.mean_frame, closed.digest_after, spec.outer,
                      codec=spec.codec)
        carried = decode_sparse(sent.frame, max_elements=numel)
        if mode == "weights":  # Δ = carried + unsent; the weights keep the unsent part, the buffer stays empty
            assert torch.allclose(sent.unsent, (start.anchor - local) - carried, atol=1e-6)
            assert feedback.residual is None
            assert torch.allclose(done.local, done.state.anchor - sent.unsent, atol=1e-6)
        else:
            assert sent.unsent is None and torch.allclose(feedback.residual, (start.anchor - local) - carried,
                                                          atol=1e-6)
            assert torch.equal(done.local, done.state.anchor)
    # Weights mode, a late round (the mean of others applied, ours not in it): the whole Δ stays in the weights, no
    # buffer to restore; a failed round changes nothing.
    state = OuterState(start.anchor.clone(), start.momentum.clone(), 3)
    sent = make_contribution(state, local, ErrorFeedback(), SPEC.codec, 100)
    other = close_round([("b", 100, encode_with(SparseCodec(64, 4, 2), 0.01 * heavy(numel, 52)))], numel, SPEC,
                        before=state)
    done = settle(state, sent, local, "late", 3, other.mean_frame, other.digest_after, SPEC.outer, codec=SPEC.codec)
    assert done.applied and done.carried_tokens == 100 and done.restore_feedback and sent.feedback_before == {}
    assert torch.allclose(done.local, done.state.anchor - (start.anchor - local), atol=1e-6)
    state, before = done.state, done.state.digest()
    done = settle(state, sent, local, "failed", 4, b"", "", SPEC.outer, codec=SPEC.codec)
    assert not done.applied and done.local is None and state.digest() == before
