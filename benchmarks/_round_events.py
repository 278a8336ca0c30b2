"""A discrete-event, fluid-flow model of one outer round of one module: the messages of node/peer/rounds.py and
protocol/rounds/ (member.py, reducer.py, audit.py) over home links, with one reducer (star) or in slices.

Pure Python, no network, no clock, no torch: benchmarks/scale_model.py runs it over home-link draws and N = 16 to
1,024; `model_round` is the homogeneous case (every node the same link) a shaped-link harness compares its measured
rounds with (`scale_model.py --validate FILE`). Imported, not run: `python benchmarks/scale_model.py` (about 20 s)
and tests/unit/test_scale_model.py (about a second) use it.

What a round is here (docs/ARCHITECTURE.md "The round" and "A round in slices"), from the end of the inner steps
(t = 0, every member at once) to the moment every member has applied its mean:
- every member sends each of the K units (the module, or its K slices) to that unit's reducer: a ContributeRequest
  header and the unit's frame (int8 + zstd of its part of Δ) on one stream; a reducer's own unit stays local;
- a reducer's round opens with its own frame (it sends to itself first) and closes when its quorum
  (min(min_group, holders)) of frames is in or its grace window has passed (`RoundSetup`), and answers
  every member whose frame is in with one RoundReply: the header (the frame list of every merged contributor, the next
  round's candidates, digests) and the unit's mean as payload; a frame that comes after the close is answered at
  once, late (same bytes);
- a member applies the module once every unit's reply is in and, in a checked round (a reducer's first
  NEW_REDUCER_AUDITS rounds of a module, for every member: node/peer/audit.py), once it has downloaded and recomputed
  every unit another peer reduced (FramesRequest; FramesReply and the listed frames but its own);
- random audits (min(1, audit_rate / group size) per unit and member, node/peer/audit.py) download the same frames
  in the background: they do not hold the apply (they hold the member's next send, `before_send`), and they load the
  reducer's uplink while it still answers others. They enter as their expected share of a flow (a flow of weight p),
  so their bytes are the expectation over the draws.

Links: each node has an uplink and a downlink (bits/s) and a latency (`Link`); a message from a to b arrives the mean
of their two latencies after its last byte left a (alike nodes: their link's one-way latency). Every transfer is a
fluid flow, and the flows in progress share the links max-min fairly (progressive filling: each flow gets the same
rate on a link unless it is held lower elsewhere; what it leaves goes to the others). TCP slow start, losses, the
libp2p/yamux windows and CPU (decode, merge, encode: a 25 M-value merge takes a second or more) are left out; the
transport's own headers (TCP/IP, noise, yamux) are a fixed fraction of every byte (`transport_overhead`).

Nodes come in groups of alike nodes (the same link, the same role): the round is symmetric within a group (every
member sends one frame to every reducer, every reducer reduces one unit), so the fair shares and events of one node
are those of all its group, and the model simulates groups, not nodes: a draw of 1,024 home links from a few plan
tiers is a few dozen groups. This is exact, not an approximation, for the symmetric parts; the audits' draws enter
as expectations (above), and a checked round's downloads run at once where the node runs them one unit after another
with at most 16 served at a time per reducer (protocol/rounds/trust.py `frames`; one refused as busy asks again
0.2-1 s later): its time here is optimistic.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

from pathswarm.protocol.rounds.frame_list import MAX_LISTED
from pathswarm.protocol.rounds.messages import (
    ContributeRequest,
    FrameHeader,
    FramesReply,
    FramesRequest,
    RoundReply,
    RoundStatus,
)
from pathswarm.protocol.rounds.reducers import MAX_CANDIDATES
from pathswarm.protocol.wire import _PREFIX

# ---- constants mirrored from code that imports torch (benchmarks/scale_model.py checks they still agree) ------------
SLICE_ALIGN = 4096
"""protocol/rounds/slices.py SLICE_ALIGN: one slice per this many values at most."""
AUDIT_RATE = 0.2
"""node/peer/config.py NodeConfig.audit_rate (and `node run --audit-rate`'s default)."""
NEW_REDUCER_AUDITS = 3
"""node/peer/audit.py: a reducer's first rounds of a module every member checks before applying them."""
MIN_GROUP = 64
"""protocol/spec_sections.py AveragingSpec.min_group: a round closes once this many holders are in."""
GRACE_S = 10.0
"""protocol/spec_sections.py AveragingSpec.grace_s: or once this long has passed since it opened."""

PREFIX = _PREFIX.size
"""protocol/wire.py: magic, header length, payload length before every message."""
PEER_ID_CHARS = 46
"""A libp2p peer id of an RSA key (protocol/identity.py: RSA identities) in base58: 'Qm' and 44 more."""
TOKENS = 4_096_000
"""A contribution's token count as a frame list writes it (H = 500 steps × batch 8 × 1,024 tokens): 7 digits."""
ROUND = 1000
FRAME_FIXED = 100
"""Bytes of a codec frame besides its values: magic, version, dtype, shape, block size, CRC, the zstd frame
(compression/frame.py; 4,096 Gaussian values encode to 3,502 bytes at 0.829 bytes a value: ~100)."""
MEAN_RATIO = 1.01
"""A round's mean frame ÷ one contribution's, same values (docs/BENCHMARKS.md "Many nodes": 1.01 for a mean of 16 in
the simulator, 1.004 of 2): an int8 mean of Δs encodes to about one Δ's size."""
TRANSPORT_OVERHEAD = 0.03
"""Bytes on the link per pathswarm byte, above 1: TCP/IPv4 headers are 52 of each 1,500-byte packet with timestamps
(3.5 %, less with GSO/large segments), the noise/TLS records and yamux frames a few per 16-64 KB. pathswarm's own
counters (protocol/wire.py Traffic) leave them out, so the byte figures here do too; the link times include them."""

B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def peer_id(i: int) -> str:
    """A distinct, realistic-length peer id (only its length matters to the sizes)."""
    body, x = [], i * 2654435761 + 12345
    for _ in range(PEER_ID_CHARS - 2):
        body.append(B58[x % 58])
        x = x // 58 + (i + 1) * 7919
    return "Qm" + "".join(body)


def _json_len(header: dict) -> int:
    """The header's bytes as protocol/wire.py writes them (compact JSON)."""
    return len(json.dumps(header, separators=(",", ":")).encode())


DIGEST = "0123456789abcdef" * 4


def unit_id(k: int, j: int, module: str = "shared") -> str:
    return module if k == 1 else f"{module}[{j}/{k}]"


def frame_bytes(values: float, per_value: float, ratio: float = 1.0) -> float:
    """One codec frame of `values` values at `per_value` bytes a value (× `ratio` for a mean)."""
    return per_value * ratio * values + FRAME_FIXED


def contribute_bytes(k: int, frame: float) -> float:
    """member.py `_remote`: the ContributeRequest header, then a message with an empty header and the frame."""
    ask = ContributeRequest(unit_id(k, k - 1), ROUND, TOKENS, DIGEST, "", False)
    return PREFIX + _json_len(ask.header()) + PREFIX + _json_len({}) + frame


@lru_cache(maxsize=4096)
def reply_header_bytes(k: int, merged: int, named: int) -> int:
    """A RoundReply header (service.py writes it before the mean) listing `merged` contributors' frames and naming
    `named` next candidates (0: the contributors sorted, written '=': messages.py SORTED_CONTRIBUTORS)."""
    contributors = tuple(peer_id(i) for i in range(merged))
    frames = tuple((p, TOKENS, DIGEST) for p in contributors)
    reducers = tuple(sorted(contributors)) if named == 0 else tuple(peer_id(10_000 + i) for i in range(named))
    reply = RoundReply(unit_id(k, k - 1), ROUND, RoundStatus.MERGED, contributors, TOKENS * merged, DIGEST,
                       reducers=reducers, frames=frames)
    # as told to one of the contributors: the list's commitment and that member's own entry (protocol v5)
    return PREFIX + _json_len(reply.to(contributors[0], RoundStatus.MERGED).header() if merged else reply.header())


def frames_request_bytes(k: int) -> int:
    """audit.py `fetch_frames`: the auditor's FramesRequest (it names itself to skip its own frame)."""
    return PREFIX + _json_len(FramesRequest(unit_id(k, k - 1), ROUND, peer_id(0), "").header())


def frames_download_bytes(n_frames: int, frame: float) -> float:
    """audit.py `_on_frames`: FramesReply(count), then per frame a FrameHeader message and the frame's message."""
    per = PREFIX + _json_len(FrameHeader(peer_id(0), TOKENS).header()) + PREFIX + _json_len({}) + frame
    return PREFIX + _json_len(FramesReply("ok", n_frames).header()) + n_frames * per


def slice_count(numel: int, candidates: int, cap: int | None) -> int:
    """protocol/rounds/slices.py `slice_count` (cap None: no spec cap, the hypothetical uncapped arm)."""
    if (cap is not None and cap <= 1) or candidates <= 1:
        return 1
    return max(1, min(cap if cap is not None else candidates, candidates, numel // SLICE_ALIGN))


# ---- the fluid network ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Link:
    """A node's access link: rates in bits per second; `one_way_latency_s` is the one-way latency between two nodes
    with this link (each end contributes half of it, so two different links meet at the mean of theirs)."""

    up_bps: float
    down_bps: float
    one_way_latency_s: float = 0.0


@dataclass
class Group:
    """`count` alike nodes: the same link, and the same role (a reducer reduces exactly one unit)."""

    name: str
    count: int
    link: Link
    reducer: bool = False
    reachable: bool = True
    # filled in by the simulation, per node of the group
    sent: dict[str, float] = field(default_factory=dict)
    received: dict[str, float] = field(default_factory=dict)
    apply_s: float = math.nan
    audits_done_s: float = 0.0


@dataclass
class Bundle:
    """count(src) × per_src identical flows of `size` bytes each, every src node sending per_src of them and every
    dst node receiving per_dst (per_src × |src| = per_dst × |dst|, weights may be fractional: expected flows)."""

    src: Group
    dst: Group
    size: float
    per_src: float
    per_dst: float
    kind: str
    on_done: Callable[[float], None] | None
    left: float = 0.0
    rate: float = 0.0
    moved: float = 0.0
    """Bytes one flow has moved (integrated rate): equals `size` at completion (tests check the fluid conserves)."""
    t_done: float = math.nan
    """When its last byte left src."""


class Fluid:
    """Flows sharing each node's uplink and downlink max-min fairly, advanced from event to event."""

    def __init__(self, transport_overhead: float = TRANSPORT_OVERHEAD):
        self.now = 0.0
        self.overhead = transport_overhead
        self.active: list[Bundle] = []
        self.done: list[Bundle] = []
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self._stale = False  # the rates no longer match the flows in progress

    def at(self, t: float, fn: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, fn))

    def send(self, src: Group, dst: Group, size: float, per_src: float, per_dst: float, kind: str,
             on_done: Callable[[float], None] | None = None) -> None:
        """Start a bundle now; `on_done(t)` runs when its last byte reaches dst (latency after it left src)."""
        if per_src <= 0 or per_dst <= 0 or size <= 0:
            return
        src.sent[kind] = src.sent.get(kind, 0.0) + per_src * size
        dst.received[kind] = dst.received.get(kind, 0.0) + per_dst * size
        self.active.append(Bundle(src, dst, size, per_src, per_dst, kind, on_done, left=size))
        self._stale = True

    def count(self, src: Group, dst: Group, size: float, per_src: float, per_dst: float, kind: str) -> None:
        """Bytes of a small message that is modelled by its latency only (a request before a download)."""
        src.sent[kind] = src.sent.get(kind, 0.0) + per_src * size
        dst.received[kind] = dst.received.get(kind, 0.0) + per_dst * size

    def latency(self, a: Group, b: Group) -> float:
        return (a.link.one_way_latency_s + b.link.one_way_latency_s) / 2

    def _share(self) -> None:
        """Max-min fair rates (bytes/s per flow) by progressive filling over the per-node links."""
        scale = 8 * (1 + self.overhead)
        residual: dict[tuple[str, int], float] = {}
        weight: dict[tuple[str, int], float] = {}
        on: dict[tuple[str, int], list[Bundle]] = {}
        for b in self.active:
            for key, cap, w in ((("up", id(b.src)), b.src.link.up_bps / scale, b.per_src),
                                (("down", id(b.dst)), b.dst.link.down_bps / scale, b.per_dst)):
                residual.setdefault(key, cap)
                weight[key] = weight.get(key, 0.0) + w
                on.setdefault(key, []).append(b)
        frozen: set[int] = set()
        while len(frozen) < len(self.active):
            share, key = min((residual[k] / w, k) for k, w in weight.items() if w > 1e-12)
            share = max(share, 0.0)
            for b in on[key]:
                if id(b) in frozen:
                    continue
                b.rate = share
                frozen.add(id(b))
                for k2, w in ((("up", id(b.src)), b.per_src), (("down", id(b.dst)), b.per_dst)):
                    residual[k2] -= w * share
                    weight[k2] -= w
            weight[key] = 0.0

    def run(self) -> None:
        while self.active or self.events:
            if self._stale:
                self._share()
                self._stale = False
            t_flow = min((self.now + b.left / b.rate for b in self.active if b.rate > 0), default=math.inf)
            t_event = self.events[0][0] if self.events else math.inf
            if t_flow == math.inf and t_event == math.inf:
                raise RuntimeError("flows with no rate and nothing scheduled: a link of zero capacity")
            t = min(t_flow, t_event)
            dt = t - self.now
            for b in self.active:
                step = min(b.left, b.rate * dt)
                b.left -= step
                b.moved += step
            self.now = t
            finished = [b for b in self.active if b.left <= 1e-9 * b.size + 1e-9]
            if finished:
                gone = {id(b) for b in finished}
                self.active = [b for b in self.active if id(b) not in gone]
                for b in finished:
                    b.moved += b.left
                    b.left = 0.0
                    b.t_done = t
                    self.done.append(b)
                    if b.on_done is not None:
                        done, when = b.on_done, t + self.latency(b.src, b.dst)
                        self.at(when, lambda done=done, when=when: done(when))
                self._stale = True
                continue
            while self.events and self.events[0][0] <= t:
                _, _, fn = heapq.heappop(self.events)
                fn()


# ---- one round ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RoundSetup:
    """What one round's messages depend on, besides the nodes."""

    numel: int
    units: int
    """K: 1 (one reducer) or the round's slices; the groups' reducers reduce one unit each."""
    frame_per_value: float
    """Bytes per value of a member's frame (int8 + zstd of Δ, error feedback in)."""
    mean_ratio: float = MEAN_RATIO
    audit_rate: float = AUDIT_RATE
    checked: bool = False
    """Every reducer on probation: members download each unit's frames before applying it."""
    min_group: int | None = None
    """The quorum (None: every holder: the round waits for all and merges all)."""
    grace_s: float | None = None
    """The grace window (AveragingSpec.grace_s): a reducer's round opens with its own frame (t = 0: it sends to itself
    first, member.py) and closes by then whatever is in; later frames are answered late. None: no window (an
    operator whose frames take longer than the default 10 s to upload sets it above that, or every round closes with
    the reducer's own frame alone)."""
    candidates_cap: int | None = MAX_CANDIDATES
    """protocol/rounds/reducers.py MAX_CANDIDATES (None: lifted, as the uncapped arm needs)."""
    transport_overhead: float = TRANSPORT_OVERHEAD
    list_bytes: bool = True
    """False: the reply's frame list and candidate list cost nothing (what the O(N) list costs, by difference)."""


def named_candidates(units: int, merged: int, reachable_merged: int, cap: int | None) -> int:
    """How many candidates a reply names (0: written '='), protocol/rounds/reducers.py `next_candidates`: one reducer
    names itself first, then the others sorted (a list); a slice names the merged members sorted, clients out and at
    most `cap`: '=' when that is every contributor."""
    cap = cap if cap is not None else 1 << 30
    if units > 1 and reachable_merged == merged and merged <= cap:
        return 0
    return max(1, min(cap, reachable_merged))


def simulate(groups: list[Group], setup: RoundSetup) -> dict:
    """One round over `groups`; returns its times and every group's bytes per node (see `summary`)."""
    n = sum(g.count for g in groups)
    reducers = [g for g in groups if g.reducer]
    k = setup.units
    if sum(g.count for g in reducers) != k:
        raise ValueError(f"{sum(g.count for g in reducers)} reducer nodes for {k} units")
    quorum = n if setup.min_group is None else min(setup.min_group, n)
    if quorum > MAX_LISTED:
        raise ValueError(f"a frame list of {quorum} exceeds MAX_LISTED = {MAX_LISTED}")
    values = setup.numel / k
    frame = frame_bytes(values, setup.frame_per_value)
    mean = frame_bytes(values, setup.frame_per_value, setup.mean_ratio)
    contribution = contribute_bytes(k, frame)
    request = frames_request_bytes(k)
    net = Fluid(setup.transport_overhead)

    def others(a: Group, b: Group) -> int:
        """Nodes of b each node of a deals with (itself left out)."""
        return b.count - (1 if a is b else 0)

    # per reducer group (every node of it alike): frames in, who sent them, and the result once closed
    frames_in = {id(r): 1.0 for r in reducers}  # its own frame: in from the start (it sends to itself first)
    reachable_in = {id(r): 1.0 if r.reachable else 0.0 for r in reducers}
    arrived: dict[int, list[Group]] = {id(r): [] for r in reducers}
    result: dict[int, dict] = {}
    units_in = {id(g): 0.0 for g in groups}
    checks_in = {id(g): 0.0 for g in groups}
    checks_due = {id(g): float(k - (1 if g.reducer else 0)) if setup.checked else 0.0 for g in groups}
    last_arrival = [0.0]

    def maybe_apply(g: Group, t: float) -> None:
        if math.isnan(g.apply_s) and units_in[id(g)] >= k - 1e-9 and checks_in[id(g)] >= checks_due[id(g)] - 1e-9:
            g.apply_s = t

    def reply_in(r: Group, g: Group, t: float, listed: bool) -> None:
        units_in[id(g)] += others(g, r)
        got = result[id(r)]
        download = frames_download_bytes(got["merged"] - (1 if listed else 0), frame)  # the listed but its own
        if setup.checked:
            net.count(g, r, request, others(g, r), others(r, g), "check")
            net.at(t + net.latency(g, r), lambda: net.send(r, g, download, others(r, g), others(g, r), "check",
                                                           lambda t2: check_in(r, g, t2)))
        elif got["p_audit"] > 0:
            p = got["p_audit"]
            net.count(g, r, request, p * others(g, r), p * others(r, g), "audit")
            net.at(t + net.latency(g, r), lambda: net.send(r, g, download, p * others(r, g), p * others(g, r),
                                                           "audit", lambda t2: audit_in(g, t2)))
        maybe_apply(g, t)

    def check_in(r: Group, g: Group, t: float) -> None:
        checks_in[id(g)] += others(g, r)
        maybe_apply(g, t)

    def audit_in(g: Group, t: float) -> None:
        g.audits_done_s = max(g.audits_done_s, t)

    def answer(r: Group, g: Group, listed: bool) -> None:
        net.send(r, g, result[id(r)]["reply"], others(r, g), others(g, r), "reply",
                 lambda t: reply_in(r, g, t, listed))

    def close(r: Group) -> None:
        if id(r) in result:
            return
        merged = min(frames_in[id(r)], quorum)
        share = reachable_in[id(r)] / frames_in[id(r)]  # of a batch past the quorum, its reachable share is merged
        merged_n = max(1, round(merged))
        reachable_n = max(0, min(merged_n, round(merged * share)))
        named = named_candidates(k, merged_n, reachable_n, setup.candidates_cap)
        header = reply_header_bytes(k, merged_n, named) if setup.list_bytes else reply_header_bytes(k, 0, 0)
        p_audit = min(1.0, setup.audit_rate / merged_n) if setup.audit_rate > 0 and merged_n > 1 else 0.0
        result[id(r)] = {"t": net.now, "merged": merged_n, "named": named, "header": header, "reply": header + mean,
                         "p_audit": p_audit}
        units_in[id(r)] += 1  # its own unit's mean: no message
        maybe_apply(r, net.now)
        for g in arrived[id(r)]:
            answer(r, g, listed=True)

    def frame_in(g: Group, r: Group, t: float) -> None:
        last_arrival[0] = max(last_arrival[0], t)
        if id(r) in result:
            answer(r, g, listed=False)  # late: the round's result, at once
            return
        arrived[id(r)].append(g)
        frames_in[id(r)] += others(r, g)
        reachable_in[id(r)] += others(r, g) if g.reachable else 0
        if frames_in[id(r)] >= quorum - 1e-9:
            close(r)

    for r in reducers:
        if frames_in[id(r)] >= quorum:  # a quorum of one (a node alone) closes at once
            net.at(0.0, lambda r=r: close(r))
        elif setup.grace_s is not None:
            net.at(setup.grace_s, lambda r=r: close(r))
    for g in groups:
        for r in reducers:
            net.send(g, r, contribution, others(g, r), others(r, g), "contribution",
                     lambda t, g=g, r=r: frame_in(g, r, t))
    net.run()
    for b in net.done:
        assert abs(b.moved - b.size) <= 1e-6 * b.size + 1e-6, (b.kind, b.moved, b.size)
    unapplied = [g.name for g in groups if math.isnan(g.apply_s)]
    if unapplied:
        raise RuntimeError(f"groups never applied: {unapplied}")
    closes = list(result.values())
    # The transfer that ended last before the last apply (audits aside): the round's critical link.
    last = max((b for b in net.done if b.kind != "audit"), key=lambda b: b.t_done)
    merged = min(c["merged"] for c in closes)
    header = max(c["header"] for c in closes)
    return summary(groups, {
        "nodes": n, "units": k, "quorum": quorum, "merged": merged,
        "merged_everywhere": all(c["merged"] == n for c in closes), "named": max(c["named"] for c in closes),
        "frame_bytes": frame, "full_frame_bytes": frame_bytes(setup.numel, setup.frame_per_value), "mean_bytes": mean,
        "reply_header_bytes": header, "contribution_bytes": contribution,
        "audit_download_bytes": frames_download_bytes(merged - 1, frame),
        "audit_probability": max(c["p_audit"] for c in closes), "last_frame_in_s": last_arrival[0],
        "last_close_s": max(c["t"] for c in closes),
        "last_transfer": {"kind": last.kind, "src": last.src.name, "dst": last.dst.name, "ended_s": last.t_done}})


def _weighted_median(pairs: list[tuple[float, int]]) -> float:
    pairs = sorted(pairs)
    total = sum(c for _, c in pairs)
    seen = 0
    for v, c in pairs:
        seen += c
        if seen * 2 >= total:
            return v
    return math.nan


def summary(groups: list[Group], out: dict) -> dict:
    """Round time (every member applied), the median node's, the audits' end; bytes per node: the median node's and
    the busiest node's, sent and received, and the busiest's by message kind."""
    sent = [(sum(g.sent.values()), g.count) for g in groups]
    received = [(sum(g.received.values()), g.count) for g in groups]
    busiest_sent = max(groups, key=lambda g: sum(g.sent.values()))
    busiest_received = max(groups, key=lambda g: sum(g.received.values()))
    out.update({
        "round_s": max(g.apply_s for g in groups),
        "median_apply_s": _weighted_median([(g.apply_s, g.count) for g in groups]),
        "audits_done_s": max(max(g.audits_done_s, g.apply_s) for g in groups),
        "median_sent": _weighted_median(sent), "median_received": _weighted_median(received),
        "busiest_sent": max(v for v, _ in sent), "busiest_received": max(v for v, _ in received),
        "busiest_sent_by_kind": dict(busiest_sent.sent), "busiest_received_by_kind": dict(busiest_received.received),
        "busiest_sent_is_reducer": busiest_sent.reducer,
        "total_sent": sum(v * c for v, c in sent), "total_received": sum(v * c for v, c in received),
        "last_node": max(groups, key=lambda g: g.apply_s).name,
    })
    return out


def model_round(nodes: int, slices: int, numel: int, frame_bytes_per_value: float, link: Link, *,
                clients: int = 0, checked: bool = False, audit_rate: float = AUDIT_RATE,
                mean_ratio: float = MEAN_RATIO, min_group: int | None = None,
                grace_s: float | None = None, transport_overhead: float = TRANSPORT_OVERHEAD,
                slices_cap_is_k: bool = False, candidates_cap: int | None = MAX_CANDIDATES) -> dict:
    """One round of `nodes` alike nodes (the same `link`), `clients` of them behind NAT (they never reduce).

    `slices` is the spec's `[averaging] slices` (1: one reducer); the round's K follows the code's rule,
    min(slices, candidates, numel // 4096), the candidates being the reachable holders (at most MAX_CANDIDATES);
    `slices_cap_is_k`: take `slices` as K itself (still at most the reachable nodes). Returns `simulate`'s dict:
    round_s (end of inner steps → every member applied), median_apply_s, audits_done_s, bytes per node (median,
    busiest, by kind), the message sizes used, and K as `units`."""
    reachable = nodes - clients
    if reachable < 1:
        raise ValueError("no node can reduce")
    candidates = min(reachable, candidates_cap) if candidates_cap is not None else reachable
    k = min(slices, reachable) if slices_cap_is_k else slice_count(numel, candidates, slices)
    k = max(1, k)
    groups = [Group("reducers", k, link, reducer=True)]
    if reachable - k:
        groups.append(Group("members", reachable - k, link))
    if clients:
        groups.append(Group("clients", clients, link, reachable=False))
    setup = RoundSetup(numel, k, frame_bytes_per_value, mean_ratio, audit_rate, checked, min_group, grace_s,
                       candidates_cap, transport_overhead)
    return simulate(groups, setup)


def closed_form_star(nodes: int, numel: int, frame_bytes_per_value: float, link: Link,
                     transport_overhead: float = TRANSPORT_OVERHEAD) -> float:
    """One reducer, alike links, no audits: N − 1 frames into the reducer's downlink (each at most one uplink), then
    N − 1 replies out of its uplink (each at most one downlink), a latency each way."""
    scale = 8 * (1 + transport_overhead)
    up, down = link.up_bps / scale, link.down_bps / scale
    frame = frame_bytes(numel, frame_bytes_per_value)
    contribution = contribute_bytes(1, frame)
    reply = reply_header_bytes(1, nodes, min(nodes, MAX_CANDIDATES)) + frame_bytes(numel, frame_bytes_per_value,
                                                                                    MEAN_RATIO)
    m = nodes - 1
    return (contribution / min(up, down / m) + reply / min(down, up / m) + 2 * link.one_way_latency_s)


def validate_entries(entries: list[dict], default_grace_s: float | None = GRACE_S,
                     default_min_group: int | None = MIN_GROUP) -> list[dict]:
    """The model's round against measured ones: each entry {"nodes", "slices", "numel", "frame_bytes", "up_bps",
    "down_bps", "one_way_latency_s", "measured_round_s"} (every node alike; rates in bits/s; frame_bytes one member's
    whole frame of the module) and optionally "clients", "checked", "audit_rate", "min_group", "grace_s" (null: no
    window), "frame_bytes_per_value", "host_floor_s". The quorum and grace window default to the spec's: a harness
    that did not set them ran with them.

    `host_floor_s` is what the links leave out: the same harness's round at the same N, sizes and machine on links
    too fast to matter (`lan`), measured in a run of its own: the software's own time per round (decode, merge, encode,
    the p2pd daemons and event loops, all N processes on the host's cores beside each other's training). The model has
    no CPU; the round on shaped links is taken as its network time plus that floor (the merge and the replies wait on
    the frames, and the frames on nothing else: the two add on the critical path). Returns each entry with the model's
    round time (`model_round_s`, the floor included; `model_network_s` without it) and the relative errors
    (model − measured) ÷ measured of both."""
    out = []
    for e in entries:
        numel = int(e["numel"])
        per_value = float(e.get("frame_bytes_per_value") or (float(e["frame_bytes"]) - FRAME_FIXED) / numel)
        link = Link(float(e["up_bps"]), float(e["down_bps"]), float(e["one_way_latency_s"]))
        got = model_round(int(e["nodes"]), int(e["slices"]), numel, per_value, link,
                          clients=int(e.get("clients", 0)), checked=bool(e.get("checked", False)),
                          audit_rate=float(e.get("audit_rate", AUDIT_RATE)),
                          min_group=e.get("min_group", default_min_group), grace_s=e.get("grace_s", default_grace_s))
        measured = float(e["measured_round_s"])
        total = got["round_s"] + float(e.get("host_floor_s") or 0.0)
        out.append({**e, "K": got["units"], "model_round_s": total, "model_network_s": got["round_s"],
                    "relative_error": (total - measured) / measured,
                    "network_only_error": (got["round_s"] - measured) / measured, "model_merged": got["merged"],
                    "model_last_frame_in_s": got["last_frame_in_s"], "model_last_close_s": got["last_close_s"],
                    "model_median_apply_s": got["median_apply_s"], "model_busiest_sent": got["busiest_sent"],
                    "model_busiest_received": got["busiest_received"]})
    return out
