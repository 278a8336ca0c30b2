"""A state in parts (protocol/rounds/state_parts.py) and the upload cap of the states a node serves (protocol/wire.py
`Pacer`), by value."""

import pytest

from pathswarm.protocol.rounds.messages import StateReply, StateRequest
from pathswarm.protocol.rounds.state_parts import ALIGN, MAX_STATE_PARTS, part_bounds, parts_for
from pathswarm.protocol.wire import Pacer, WireError


@pytest.mark.parametrize("total, parts", [(2 * 875_264, 4), (2 * 10_000, 3), (5000, 7), (1, 1), (0, 2),
                                          (2 * 25_000_000, MAX_STATE_PARTS)])
def test_the_parts_cover_every_value_once_cut_at_aligned_edges(total, parts):
    bounds = [part_bounds(total, parts, j) for j in range(parts)]
    assert bounds[0][0] == 0 and bounds[-1][1] == total
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))  # contiguous, no overlap
    assert all(end % ALIGN == 0 for _, end in bounds[:-1])
    sizes = [end - start for start, end in bounds]
    if total >= parts * ALIGN:  # as equal as the alignment allows
        assert max(sizes) - min(sizes) <= ALIGN + total % ALIGN


def test_parts_asked_for_are_one_per_holder_and_bounded():
    assert parts_for(4, 2 * 875_264) == 4 and parts_for(1, 10**6) == 1
    assert parts_for(500, 10**9) == MAX_STATE_PARTS and parts_for(8, 3 * ALIGN) == 3 and parts_for(3, 0) == 1
    for bad in ((10, 0, 0), (10, MAX_STATE_PARTS + 1, 0), (10, 2, 2), (10, 2, -1)):
        with pytest.raises(ValueError):
            part_bounds(*bad)


def test_part_fields_travel_and_a_peer_from_before_them_reads_as_the_whole_state():
    ask = StateRequest.parse(StateRequest("shared", "", 7, 2, 4).header())
    assert (ask.round, ask.part, ask.parts) == (7, 2, 4)
    assert (StateRequest.parse({"module": "shared"}).part, StateRequest.parse({"module": "shared"}).parts) == (0, 1)
    for bad in ({"module": "m", "part": 4, "parts": 4}, {"module": "m", "parts": MAX_STATE_PARTS + 1},
                {"module": "m", "parts": 0}):
        with pytest.raises(WireError):
            StateRequest.parse(bad)
    reply = StateReply.parse(StateReply("ok", 7, "ab" * 32, ("QmA",), 1, 3).header())
    assert (reply.part, reply.parts, reply.reducers) == (1, 3, ("QmA",))
    old = StateReply.parse({"status": "ok", "round": 7, "digest": "ab" * 32})
    assert (old.part, old.parts) == (0, 1)


def test_the_pacer_holds_the_upload_to_its_rate_after_a_seconds_burst():
    pacer = Pacer(1000.0)  # bytes per second
    waits = [pacer.delay(250, 0.0) for _ in range(8)]  # 2,000 bytes asked at once
    assert waits[:4] == [0.0, 0.0, 0.0, 0.0]  # the first second's worth goes at once
    assert waits[4:] == pytest.approx([0.25, 0.5, 0.75, 1.0])  # then 250 bytes every quarter second
    assert pacer.delay(250, 10.0) == 0.0  # idle since: a burst again
    assert Pacer(0).delay(10**9, 0.0) == 0.0  # no cap
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            Pacer(bad)
