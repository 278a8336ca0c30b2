"""The round model behind benchmarks/scale_model.py (benchmarks/_round_events.py): with one reducer and alike links
its round time is the closed form (N − 1 frames into the reducer's downlink, N − 1 replies out of its uplink, a
latency each way); slices with K = N spread the reducer's load to about two frames a node each way; the fluid network
moves every byte it is given, shares links processor-sharing style and max-min fairly; the message sizes are the real
encodings'; --validate's reader gives the model's round and the relative error. Pure Python: about a second.

    pytest tests/unit/test_scale_model.py
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest


def _load_model():
    """benchmarks/_round_events.py by its path: benchmarks/ is no package, and putting it on sys.path would let its
    scripts (codec.py, wire.py, ...) shadow other modules for the rest of the session."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "_round_events.py"
    spec = importlib.util.spec_from_file_location("_round_events", path)
    assert spec is not None and spec.loader is not None
    module = sys.modules.get("_round_events") or importlib.util.module_from_spec(spec)
    if "_round_events" not in sys.modules:
        sys.modules["_round_events"] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return module


ev = _load_model()

CABLE = ev.Link(up_bps=20e6, down_bps=200e6, one_way_latency_s=0.03)
FIBER = ev.Link(up_bps=150e6, down_bps=100e6, one_way_latency_s=0.01)
NUMEL = 25_000_000
PER_VALUE = 0.8


@pytest.mark.parametrize("link", [CABLE, FIBER])
@pytest.mark.parametrize("nodes", [2, 3, 16, 64])
def test_one_reducer_on_alike_links_is_the_closed_form(nodes, link):
    got = ev.model_round(nodes, 1, NUMEL, PER_VALUE, link, audit_rate=0.0)
    want = ev.closed_form_star(nodes, NUMEL, PER_VALUE, link)
    assert got["units"] == 1
    assert got["round_s"] == pytest.approx(want, rel=1e-9)
    # the reducer sends N − 1 replies (header and mean) and receives N − 1 frames; a member one frame each way
    frame = got["full_frame_bytes"]
    reply = got["reply_header_bytes"] + got["mean_bytes"]
    assert got["busiest_sent"] == pytest.approx((nodes - 1) * reply)
    assert got["busiest_received"] == pytest.approx(max((nodes - 1) * got["contribution_bytes"], reply))
    if nodes > 2:  # the median node is a member: its frame out, the mean in
        assert got["median_sent"] == pytest.approx(got["contribution_bytes"])
        assert got["median_received"] / frame == pytest.approx(ev.MEAN_RATIO, abs=0.01)


def test_slices_with_one_per_node_spread_the_reducer_load():
    nodes = 16
    star = ev.model_round(nodes, 1, NUMEL, PER_VALUE, CABLE, audit_rate=0.0)
    sliced = ev.model_round(nodes, nodes, NUMEL, PER_VALUE, CABLE, audit_rate=0.0)
    frame = sliced["full_frame_bytes"]
    assert sliced["units"] == nodes
    # each node: its N − 1 slices out and the means of its slice out; the same in: 2 × (N − 1) / N frames and headers
    floor = (nodes - 1) / nodes * (1 + ev.MEAN_RATIO)
    for key in ("busiest_sent", "busiest_received", "median_sent", "median_received"):
        assert floor <= sliced[key] / frame <= floor + 0.01, (key, sliced[key] / frame)
    assert star["busiest_sent"] / frame > 15
    # the reducer's uplink was the round's bottleneck: 16 replies over one cable uplink against 1/16 each
    assert sliced["round_s"] < star["round_s"] / 5


def test_checked_rounds_and_audits_add_their_downloads():
    nodes = 8
    plain = ev.model_round(nodes, nodes, NUMEL, PER_VALUE, CABLE, audit_rate=0.0)
    audited = ev.model_round(nodes, nodes, NUMEL, PER_VALUE, CABLE)
    checked = ev.model_round(nodes, nodes, NUMEL, PER_VALUE, CABLE, checked=True, audit_rate=0.0)
    slice_frame = plain["frame_bytes"]
    # checked: every member downloads every other unit's N − 1 listed frames but its own, before applying
    extra = checked["median_received"] - plain["median_received"]
    assert extra == pytest.approx((nodes - 1) * (nodes - 1) * slice_frame, rel=0.01)
    assert checked["round_s"] > 2 * plain["round_s"]
    # random audits: rate / N per unit and member, N − 1 frames each: 0.2 × (N − 1) slice frames a reducer serves
    served = audited["median_sent"] - plain["median_sent"]
    assert served == pytest.approx(ev.AUDIT_RATE * (nodes - 1) / nodes * (nodes - 1) * slice_frame, rel=0.02)
    assert audited["round_s"] >= plain["round_s"] - 1e-9  # the apply does not wait for them
    assert audited["audits_done_s"] > audited["round_s"]


def _network(overhead: float = 0.0) -> tuple[ev.Fluid, list[ev.Group]]:
    groups = [ev.Group("a", 1, ev.Link(8e6, 8e6)), ev.Group("b", 3, ev.Link(16e6, 4e6)),
              ev.Group("c", 2, ev.Link(2e6, 40e6))]
    return ev.Fluid(overhead), groups


def test_processor_sharing_of_one_uplink():
    net, (a, b, c) = _network()
    # two flows out of a's 1 MB/s uplink (c's downlinks are faster): 1 MB and 2 MB
    done = {}
    net.send(a, c, 1e6, 1, 0.5, "x", lambda t: done.setdefault("small", t))
    net.send(a, c, 2e6, 1, 0.5, "y", lambda t: done.setdefault("big", t))
    net.run()
    assert done["small"] == pytest.approx(2.0)  # half the uplink each until it ends
    assert done["big"] == pytest.approx(3.0)  # then the whole of it
    assert a.sent == {"x": 1e6, "y": 2e6}


def test_the_fluid_conserves_bytes_and_shares_max_min_fairly():
    net, (a, b, c) = _network(overhead=0.05)
    shapes = [(a, b, 3e6, 3, 1), (b, c, 2e6, 2, 3), (c, a, 5e5, 1, 2), (b, b, 1e6, 2, 2), (a, c, 1e6, 0.4, 0.2)]
    for src, dst, size, per_src, per_dst in shapes:
        net.send(src, dst, size, per_src, per_dst, "k")
    net.at(0.7, lambda: net.send(c, b, 4e6, 1.5, 1, "late"))
    net._share()
    caps = {}
    for g in (a, b, c):
        caps[("up", id(g))] = g.link.up_bps / 8 / 1.05
        caps[("down", id(g))] = g.link.down_bps / 8 / 1.05
    use = dict.fromkeys(caps, 0.0)
    for x in net.active:
        use[("up", id(x.src))] += x.per_src * x.rate
        use[("down", id(x.dst))] += x.per_dst * x.rate
    assert all(use[k] <= caps[k] * (1 + 1e-9) for k in caps)
    for x in net.active:  # max-min: every flow has a saturated link on which no flow gets more
        links = (("up", id(x.src)), ("down", id(x.dst)))
        assert any(use[k] >= caps[k] * (1 - 1e-9) and all(
            y.rate <= x.rate * (1 + 1e-9) for y in net.active if k in (("up", id(y.src)), ("down", id(y.dst))))
            for k in links), x
    net.run()
    assert len(net.done) == len(shapes) + 1
    for x in net.done:
        assert x.moved == pytest.approx(x.size, rel=1e-9)
    sent = sum(g.count * sum(g.sent.values()) for g in (a, b, c))
    received = sum(g.count * sum(g.received.values()) for g in (a, b, c))
    assert sent == pytest.approx(received)
    assert sent == pytest.approx(sum(src.count * per_src * size for src, _, size, per_src, _ in shapes)
                                 + c.count * 1.5 * 4e6)


def test_message_sizes_are_the_encodings():
    one = ev.reply_header_bytes(16, 1, 0)
    per_entry = (ev.reply_header_bytes(16, 101, 0) - one) / 100
    # a contributor's peer id in JSON, quotes and a comma (protocol v5: equal token counts said once, the frames'
    # hashes behind one commitment; a [peer id, tokens, sha256 hex] entry each cost 46 + 7 + 64 + 9 characters)
    assert per_entry == pytest.approx(ev.PEER_ID_CHARS + 3, abs=1)
    # naming the next candidates costs a peer id each, unless they are the contributors sorted ('=')
    assert ev.reply_header_bytes(16, 16, 16) - ev.reply_header_bytes(16, 16, 0) >= 16 * ev.PEER_ID_CHARS
    assert ev.named_candidates(16, 16, 16, 64) == 0
    assert ev.named_candidates(16, 16, 10, 64) == 10  # clients in the round: a list
    assert ev.named_candidates(1, 16, 16, 64) == 16  # one reducer names itself first: a list
    assert ev.named_candidates(64, 1024, 1024, 64) == 64
    assert 100 < ev.contribute_bytes(64, 0) < 300
    assert ev.frames_download_bytes(10, 1000) - ev.frames_download_bytes(0, 1000) > 10 * 1000


def test_slice_count_is_the_codes_rule():
    assert ev.slice_count(NUMEL, 16, 1) == 1
    assert ev.slice_count(NUMEL, 1, 64) == 1
    assert ev.slice_count(NUMEL, 100, 64) == 64
    assert ev.slice_count(NUMEL, 1000, None) == 1000
    assert ev.slice_count(5 * 4096, 16, 64) == 5  # one per 4096 values


def test_validate_entries_reports_the_relative_error():
    link = ev.Link(50e6, 50e6, 0.02)
    model = ev.model_round(8, 8, 2_000_000, 0.8, link, grace_s=None, min_group=64)["round_s"]
    entry = {"nodes": 8, "slices": 8, "numel": 2_000_000, "frame_bytes": 0.8 * 2_000_000 + ev.FRAME_FIXED,
             "up_bps": 50e6, "down_bps": 50e6, "one_way_latency_s": 0.02, "grace_s": None}
    got = ev.validate_entries([{**entry, "measured_round_s": model}, {**entry, "measured_round_s": model / 2}])
    assert got[0]["K"] == 8
    assert got[0]["relative_error"] == pytest.approx(0.0, abs=1e-9)
    assert got[1]["relative_error"] == pytest.approx(1.0)
    # a measured host floor (the same harness on unshaped links) adds to the network's time
    floored = ev.validate_entries([{**entry, "measured_round_s": model + 1.5, "host_floor_s": 1.5}])[0]
    assert floored["model_round_s"] == pytest.approx(model + 1.5)
    assert floored["model_network_s"] == pytest.approx(model)
    assert floored["relative_error"] == pytest.approx(0.0, abs=1e-9)
    assert floored["network_only_error"] == pytest.approx(-1.5 / (model + 1.5))


def test_the_grace_window_closes_on_what_is_in():
    # a 1 B module over cable: nothing another member sends is in after 10 s; every member gets the reducer's own
    got = ev.model_round(16, 1, 1_000_000_000, PER_VALUE, CABLE, grace_s=10.0, audit_rate=0.0)
    assert got["merged"] == 1 and got["last_close_s"] == pytest.approx(10.0)
    assert math.isfinite(got["round_s"])
