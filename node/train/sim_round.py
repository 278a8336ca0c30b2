"""One module's outer round in the simulator (node/train/simulate.py), by the node's own rule: every holder makes
its contribution (node/train/round.py), the round closes over all of them as the reducer closes it
(protocol/rounds/rule.py; per slice when the spec cuts rounds into slices, protocol/rounds/slices.py), and every
holder settles the result. Closing and settling are two calls, so that the simulator can settle a round after
some of the next round's inner steps, as a decoupled node does (`SimConfig.overlap`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from pathswarm.node.train.round import (
    eager_shift,
    feedback_decay,
    make_slice_contributions,
    restore_feedback,
    settle,
    settle_slices,
)
from pathswarm.node.train.worker import PathWorker
from pathswarm.protocol.rounds.reducers import successors
from pathswarm.protocol.rounds.rule import close_round, mean_bound, reference_norm
from pathswarm.protocol.rounds.slices import rotated, slice_count, units_of, view
from pathswarm.protocol.spec import SwarmSpec

if TYPE_CHECKING:
    from pathswarm.node.train.simulate import SimResult

Tamper = Callable[[int, str, int, bytes], bytes]
"""(worker index, module id, round, the worker's frame) → the frame actually sent: benchmarks/byzantine.py
makes one worker hostile with it."""


@dataclass
class ClosedRound:
    """A module's round closed by the reducer(s), not yet settled by its holders."""

    mid: str
    holders: list[PathWorker]
    units: list
    sent: dict[str, list]
    tokens: dict[str, int]
    own_norm: dict[str, float]
    closes: list[tuple]
    bytes: int
    moved: dict[str, torch.Tensor] = field(default_factory=dict)
    """Eager (`move_eagerly`): holder → what its local weights were moved by at the send."""


def close_module_round(spec: SwarmSpec, mid: str, r: int, holders: list[PathWorker],
                     carry: dict[tuple[str, str], int], result: SimResult, tamper: Tamper | None,
                     workers: list[PathWorker]) -> ClosedRound:
    """One module's outer round among its holders, by the node's own rule (protocol/rounds/rule.py and
    node/train/round.py): every holder makes a contribution and the round closes over all of them (the reducer's
    merge and one encoded mean; per slice when the spec cuts rounds into slices, protocol/rounds/slices.py);
    `settle_module_round` then has every holder settle the result."""
    t_round = time.perf_counter()
    first = holders[0].outer[mid]
    numel = first.anchor.numel()
    # before any result names a list (round 0): the holders, sorted, as a node's genesis list (slices.py `agreed_list`)
    units = units_of(mid, numel, slice_count(numel, first.reducers or tuple(sorted(w.name for w in holders)),
                                             spec.averaging.slices))
    sent, tokens = {}, {}
    for w in holders:
        tokens[w.name] = w.round_tokens + carry.pop((w.name, mid), 0)
        sent[w.name] = make_slice_contributions(w.outer[mid], w.flat(mid), w.feedback[mid], spec.codec,
                                                tokens[w.name], units, feedback_decay(spec))
    names = sorted(sent)
    own_norm = {name: math.sqrt(sum(c.delta_norm ** 2 for c in parts)) for name, parts in sent.items()}
    agreed = first.reducers if set(first.reducers) == set(names) else tuple(names)
    closes, up, down = [], 0, 0
    for j, unit in enumerate(units):
        frames = {name: sent[name][j].frame for name in names}
        if tamper is not None:
            frames = {w.name: tamper(workers.index(w), unit.id, r, frames[w.name]) for w in holders}
        closed = close_round([(name, sent[name][j].tokens, frames[name]) for name in names], unit.numel, spec,
                             before=view(first, unit))
        result.rejected += len(closed.rejected)
        # The reducer: the smallest name, as the smallest peer id in a swarm; a slice's, its rotation of the list.
        reducer = min(frames) if unit.k == 1 else rotated(agreed, r, unit.j)[0]
        following = successors(reducer, closed.used) if unit.k == 1 else tuple(sorted(closed.used))
        closes.append((closed, reducer, following))
        # Every other holder sends its frame to the reducer and gets the encoded mean back.
        up += sum(len(f) for name, f in frames.items() if name != reducer)
        down += len(closed.mean_frame) * (len(frames) - 1)
    result.bytes_up_total += up
    result.bytes_down_total += down
    result.round_s += time.perf_counter() - t_round
    return ClosedRound(mid, holders, units, sent, tokens, own_norm, closes, up + down)


def move_eagerly(spec: SwarmSpec, c: ClosedRound) -> None:
    """Eager updates (node/train/round.py `eager_shift`): every holder of a round in flight moves its local weights
    to the outer step of its own outer gradient, and settles the round later with that move taken back out."""
    for w in c.holders:
        local = w.flat(c.mid)
        moved = eager_shift(w.outer[c.mid], local, spec.outer)
        if moved is not None:
            c.moved[w.name] = moved
            w.set_flat(c.mid, local + moved)


def settle_module_round(spec: SwarmSpec, c: ClosedRound, carry: dict[tuple[str, str], int], result: SimResult) -> None:
    """Every holder of a closed round settles it on its local weights as they are now."""
    t_round = time.perf_counter()
    mid, holders, units, sent, closes = c.mid, c.holders, c.units, c.sent, c.closes
    for w in holders:
        state, local = w.outer[mid], w.flat(mid)
        moved = c.moved.get(w.name)
        parts = []
        for j, (unit, (closed, reducer, following)) in enumerate(zip(units, closes, strict=True)):
            mine = sent[w.name][j]
            status = ("alone" if len(closed.used) == 1 else "merged") if w.name in closed.used else "late"
            if not closed.mean_frame:
                status = "failed"
            piece = view(state, unit)
            # the member's bound is the whole module's, as the node's (node/peer/round_checks.py `check`)
            parts.append(settle(piece, mine, local[unit.lo:unit.hi], status, piece.round, closed.mean_frame,
                                closed.digest_after, spec.outer, codec=spec.codec, next_reducers=following,
                                bound=None if w.name == reducer else mean_bound(c.own_norm[w.name], mine.tokens,
                                                                                reference_norm(state), spec,
                                                                                len(closed.used)),
                                moved=None if moved is None else moved[unit.lo:unit.hi]))
            if parts[-1].lie:  # the members' bound holds every honest round: the simulator runs none other
                raise AssertionError(f"{unit.id} round {piece.round}: an honest mean broke {w.name}'s bound: "
                                     f"{parts[-1].lie}")
        sliced = settle_slices(state, units, parts, local, c.tokens[w.name])
        done = sliced.settlement
        if done.state is not None:
            w.outer[mid] = done.state
        if done.local is not None:
            w.set_flat(mid, done.local)
        restore_feedback(w.feedback[mid], units, sent[w.name], sliced.restore)
        if done.carried_tokens:
            carry[(w.name, mid)] = done.carried_tokens
    if any(closed.mean_frame for closed, _, _ in closes):
        result.history.setdefault(mid, {})[str(holders[0].outer[mid].round)] = holders[0].digest(mid)
    result.round_s += time.perf_counter() - t_round
