"""Every parser of peer data against hostile input: only its typed error comes out, nothing hangs.

DHT records (`parse_record`, `SwarmRecordValidator.validate`, `peer_id_of_owner`), membership
certificates (`parse`, `verify`, `Gate.check`), RPC framing (`read_message`, `field_of`), the module
exchange's handlers and state download (driven offline with a fake stream and fake PeerStreams), and spec
text (`loads_spec`). The inputs and each parser's contract (bounds, round trip) are tests/fuzzing.py's,
the table benchmarks/fuzz.py runs 100,000 inputs per parser of; here hypothesis drives its generators
through a `random.Random` it controls, so a failure shrinks. Codec frames have their own fuzz tests
(tests/unit/test_codec_fuzz.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import struct
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pathswarm.protocol.dht import peer_id_of_owner
from pathswarm.protocol.records import parse_record, record_to_wire
from pathswarm.protocol.spec import SpecError, loads_spec
from pathswarm.protocol.wire import MAGIC, MAX_HEADER_BYTES

from ..fuzzing import (
    BASE_SPECS,
    BY_NAME,
    FRAME,
    FUZZERS,
    LOOP,
    MESSAGES,
    PEER,
    RECORDS,
    RSA_OWNER,
    SPEC,
    STATE,
    STATE_PAYLOAD,
    FakeStreams,
    as_sent,
    exchange,
    handle,
    message,
    outcome,
    read,
)

pytestmark = pytest.mark.timeout(120)

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("fuzzer", [f for f in FUZZERS if f.name != "compression.decode"], ids=lambda f: f.name)
@FUZZ
@given(rng=st.randoms(use_true_random=False))
def test_only_the_typed_error_comes_out(fuzzer, rng):
    outcome(fuzzer, fuzzer.generate(rng))


# ---- DHT records ----------------------------------------------------------------------------------
def test_the_valid_records_parse_in_every_form():
    for record in RECORDS:
        for how in ("dict", "msgpack", "json", "text"):
            raw = as_sent(record_to_wire(record), how)
            assert outcome(BY_NAME["records.parse_record"], (type(record), raw, SPEC)) == ("accepted", None)
            assert parse_record(type(record), raw, SPEC) == record


def test_an_owner_key_of_an_unknown_kind_names_no_peer():
    # Found by the fuzz tests: the except clause named a class cryptography does not have (AttributeError).
    assert peer_id_of_owner(RSA_OWNER.replace(b"ssh-rsa", b"rsh-rsa")) is None
    assert peer_id_of_owner(RSA_OWNER) == PEER


# ---- RPC framing -------------------------------------------------------------------------------------
def read_kind(data: bytes, max_payload: int) -> str:
    """'accepted' when read_message returns a message within its bounds, 'typed_error' when it refuses it."""
    return outcome(BY_NAME["wire.read_message"], (data, max_payload))[0]


def test_the_valid_messages_read_back():
    for data in MESSAGES:
        assert read_kind(data, 1 << 20) == "accepted"


def test_a_huge_declared_length_is_refused_before_allocation():
    tracemalloc.start()
    try:
        start = time.perf_counter()
        for payload_len, limit in [(1 << 40, 1 << 41), ((1 << 64) - 1, 1 << 63), (1 << 62, 1 << 20)]:
            assert read_kind(struct.pack("<4sIQ", MAGIC, 2, payload_len) + b"{}" + b"x" * 100, limit) == "typed_error"
        assert read_kind(struct.pack("<4sIQ", MAGIC, (1 << 32) - 1, 0) + b"{}", 1 << 20) == "typed_error"
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - start < 1.0
    assert peak < 1 << 20, f"{peak} bytes allocated for a message that never came"


def test_a_header_of_nested_brackets_is_a_wire_error():
    # Found by the fuzz tests: json's RecursionError escaped read_message.
    head = b"[" * MAX_HEADER_BYTES
    assert read_kind(struct.pack("<4sIQ", MAGIC, len(head), 0) + head, 0) == "typed_error"


# ---- the module exchange's handlers and state download, offline -------------------------------------
@pytest.mark.parametrize("round_", ["x", [1], float("inf"), -1, 1 << 64, 10**400])
def test_a_state_reply_with_a_bad_round_is_no_state(round_):
    # Found by the fuzz tests: int() of the round raised, and state_digest raised on a negative or huge one.
    reply = message({"status": "ok", "round": round_, "digest": STATE.digest()}, STATE_PAYLOAD)
    assert asyncio.run(exchange(False, FakeStreams(reply)).fetch_state(PEER, "L0M1", 5.0)) is None
    at5 = dataclasses.replace(STATE, round=5).digest()  # a state is accepted only with its own digest
    good = message({"status": "ok", "round": 5, "digest": at5}, STATE_PAYLOAD)
    assert asyncio.run(exchange(False, FakeStreams(good)).fetch_state(PEER, "L0M1", 5.0)).round == 5


def test_a_huge_token_count_fails_only_its_own_contribution():
    # Found by the fuzz tests: float(10**400) in weighted_average raised inside the round's close.
    def status(tokens):
        sent = message({"module": "shared", "round": STATE.round, "tokens": tokens, "digest": STATE.digest()})
        reply = LOOP.run(handle("_on_contribute", False, sent + message({}, FRAME)))
        return LOOP.run(read(reply, 1 << 20))[0]["status"]

    assert status(10**400) == status(1 << 60) == "failed"
    assert status(1000) == "alone"


# ---- spec text ---------------------------------------------------------------------------------------
def test_hostile_spec_values_are_spec_errors():
    # Found by the fuzz tests: each once escaped loads_spec as ValueError, RecursionError or OverflowError,
    # or was accepted and left the spec without an id.
    for value in ["1" + "0" * 5000, "[" * 3000 + "]" * 3000, "{a=" * 3000 + "1" + "}" * 3000, "inf", "nan",
                  "1" + "0" * 400]:
        with pytest.raises(SpecError):
            loads_spec(BASE_SPECS[0].replace("grace_s = 10.0", f"grace_s = {value}"))
