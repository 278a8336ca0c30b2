"""DHT records: round trips, keys, and RecordError (never anything else) for every kind of bad input."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pathswarm.protocol.records import (
    MAX_RECORD_BYTES,
    ModuleAnnouncement,
    NodeMetrics,
    PathClaim,
    RecordError,
    claims_key,
    metrics_key,
    module_key,
    parse_record,
    record_to_json,
    record_to_wire,
    swarm_keys,
)
from pathswarm.protocol.spec import SwarmSpec

SPEC = SwarmSpec(name="records", levels=(2, 3))
PEER = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"

CLAIM = {"path": [1, 2], "peer_id": PEER, "tokens_per_s": 1234.5, "round": 7, "expires_at": 1.7e9}
ANNOUNCEMENT = {"module_id": "L1M2", "round": 3, "digest": "ab" * 32, "peer_id": PEER, "numel": 1000}
METRICS = {"path": [0, 0], "peer_id": PEER, "round": 3, "loss": 2.5, "tokens_per_s": 900.0,
           "bytes_sent": 10, "bytes_received": 20}
GOOD = [(PathClaim, CLAIM), (ModuleAnnouncement, ANNOUNCEMENT), (NodeMetrics, METRICS),
        # the wire (msgpack) has lists only: a node that caught a liar announces it in one
        (ModuleAnnouncement, {**ANNOUNCEMENT, "distrusts": [PEER, "QmOther"]})]


@pytest.mark.parametrize("model, raw", GOOD)
def test_round_trip_through_wire_and_json(model, raw):
    record = parse_record(model, raw, SPEC)
    assert record_to_wire(record) == raw
    assert parse_record(model, record_to_json(record), SPEC) == record
    assert parse_record(model, record_to_json(record).decode(), SPEC) == record


def test_path_is_a_tuple_and_records_are_frozen():
    claim = parse_record(PathClaim, CLAIM)
    assert claim.path == (1, 2)
    with pytest.raises(ValueError):
        claim.round = 8  # type: ignore[misc]
    assert parse_record(PathClaim, {**CLAIM, "path": (1, 2)}) == claim  # msgpack may hand back a tuple


def test_keys_are_prefixed_with_the_swarm_id_and_distinct():
    sid = SPEC.swarm_id
    assert claims_key(sid) == f"{sid}/claims"
    assert metrics_key(sid) == f"{sid}/metrics"
    assert module_key(sid, "L0M1") == f"{sid}/module/L0M1"
    keys = swarm_keys(SPEC)
    assert len(keys) == 2 + 1 + 2 + 3  # claims, metrics, shared, L0M0-1, L1M0-2
    assert keys[module_key(sid, "shared")] is ModuleAnnouncement
    assert all(k.startswith(sid + "/") for k in keys)
    assert claims_key(SwarmSpec(name="other").swarm_id) not in keys


@pytest.mark.parametrize("bad", ["", "a/b", "x" * 129, "sp ace", None])
def test_bad_swarm_id_is_a_value_error(bad):
    with pytest.raises(ValueError):
        claims_key(bad)


@pytest.mark.parametrize("bad", ["L0", "Lx", "shared/..", "L0M1 ", ""])
def test_bad_module_id_is_a_value_error(bad):
    with pytest.raises(ValueError):
        module_key(SPEC.swarm_id, bad)


BAD = [
    (PathClaim, {**CLAIM, "extra": 1}),  # extra field
    (PathClaim, {k: v for k, v in CLAIM.items() if k != "round"}),  # missing field
    (PathClaim, {**CLAIM, "round": True}),  # bool is not an int
    (PathClaim, {**CLAIM, "round": "7"}),  # no coercion from strings
    (PathClaim, {**CLAIM, "round": 7.0}),
    (PathClaim, {**CLAIM, "round": -1}),
    (PathClaim, {**CLAIM, "round": 2**70}),
    (PathClaim, {**CLAIM, "tokens_per_s": -1.0}),
    (PathClaim, {**CLAIM, "tokens_per_s": float("nan")}),
    (PathClaim, {**CLAIM, "tokens_per_s": float("inf")}),
    (PathClaim, {**CLAIM, "expires_at": 1e300}),
    (PathClaim, {**CLAIM, "peer_id": ""}),
    (PathClaim, {**CLAIM, "peer_id": "x" * 129}),
    (PathClaim, {**CLAIM, "peer_id": "Qm\x1b[2J"}),  # terminal escapes
    (PathClaim, {**CLAIM, "path": []}),
    (PathClaim, {**CLAIM, "path": [0, -1]}),
    (PathClaim, {**CLAIM, "path": "0.1"}),
    (PathClaim, {**CLAIM, "path": [0] * 65}),
    (PathClaim, {**CLAIM, "path": {"0": 1}}),
    (ModuleAnnouncement, {**ANNOUNCEMENT, "digest": "AB" * 32}),  # lowercase hex only
    (ModuleAnnouncement, {**ANNOUNCEMENT, "digest": "ab" * 33}),
    (ModuleAnnouncement, {**ANNOUNCEMENT, "digest": ""}),
    (ModuleAnnouncement, {**ANNOUNCEMENT, "module_id": "L0M1\n"}),
    (ModuleAnnouncement, {**ANNOUNCEMENT, "numel": -5}),
    (ModuleAnnouncement, {**ANNOUNCEMENT, "distrusts": [f"Qm{i}" for i in range(9)]}),  # at most 8
    (ModuleAnnouncement, {**ANNOUNCEMENT, "distrusts": ["not an id"]}),
    (NodeMetrics, {**METRICS, "loss": float("-inf")}),
    (NodeMetrics, {**METRICS, "bytes_sent": 1.5}),
    (PathClaim, None),
    (PathClaim, [CLAIM]),
    (PathClaim, 42),
    (PathClaim, b"\xff\xfe\x00"),
    (PathClaim, b"[" * 3000),
    (PathClaim, json.dumps(CLAIM)[:-1]),
    (PathClaim, b" " * (MAX_RECORD_BYTES + 1)),
    (PathClaim, {**CLAIM, "peer_id": object()}),  # not plain data
    (PathClaim, {**CLAIM, "note": "x" * MAX_RECORD_BYTES}),  # too big, rejected before pydantic
    (PathClaim, {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {"i": {}}}}}}}}}}),  # too deep
]


@pytest.mark.parametrize("model, raw", BAD)
def test_bad_records_raise_record_error(model, raw):
    with pytest.raises(RecordError):
        parse_record(model, raw)


@pytest.mark.parametrize(
    "model, raw",
    [
        (PathClaim, {**CLAIM, "path": [2, 0]}),  # level 0 has 2 modules
        (PathClaim, {**CLAIM, "path": [0, 0, 0]}),  # 2 levels
        (NodeMetrics, {**METRICS, "path": [0]}),
        (ModuleAnnouncement, {**ANNOUNCEMENT, "module_id": "L2M0"}),  # no level 2
        (ModuleAnnouncement, {**ANNOUNCEMENT, "module_id": "L0M2"}),
    ],
)
def test_records_that_do_not_fit_the_spec_are_rejected_only_with_a_spec(model, raw):
    parse_record(model, raw)
    with pytest.raises(RecordError, match="levels"):
        parse_record(model, raw, SPEC)


def test_huge_objects_are_rejected_without_walking_them():
    # A million-element list is refused after ~4 KiB of it has been looked at.
    with pytest.raises(RecordError, match="exceeds"):
        parse_record(PathClaim, {**CLAIM, "path": list(range(1_000_000))})
    with pytest.raises(RecordError, match="exceeds"):
        parse_record(PathClaim, {str(i): i for i in range(100_000)})


plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20) | st.binary(max_size=20),
    lambda children: st.lists(children, max_size=6) | st.tuples(children, children)
    | st.dictionaries(st.text(max_size=12), children, max_size=6),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(model=st.sampled_from([PathClaim, ModuleAnnouncement, NodeMetrics]), raw=plain)
def test_fuzz_random_plain_data_gives_a_record_or_record_error(model, raw):
    try:
        record = parse_record(model, raw, SPEC)
    except RecordError:
        return
    assert isinstance(record, model)


@settings(max_examples=300, deadline=None)
@given(model=st.sampled_from([PathClaim, ModuleAnnouncement, NodeMetrics]), raw=st.binary(max_size=200))
def test_fuzz_random_bytes_give_record_error(model, raw):
    with pytest.raises(RecordError):
        parse_record(model, raw, SPEC)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), case=st.sampled_from(GOOD))
def test_fuzz_one_field_replaced_gives_a_valid_record_or_record_error(data, case):
    # Mutations of a valid record are the likeliest attack: right shape, wrong values.
    model, raw = case
    field = data.draw(st.sampled_from(sorted(raw)))
    value = data.draw(plain)
    try:
        record = parse_record(model, {**raw, field: value}, SPEC)
    except RecordError:
        return
    wire = record_to_wire(record)
    expected = list(value) if isinstance(value, tuple) else value
    if field not in wire:  # the wire leaves out a field at its default (an empty `distrusts`, say)
        default = model.model_fields[field].default
        assert expected == (list(default) if isinstance(default, tuple) else default), (field, value)
        return
    assert wire[field] == expected
