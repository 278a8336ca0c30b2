"""A module's round in slices: its flat vector cut into K parts, each reduced by a different member.

One reducer per module per round receives every member's frame and sends the mean to every member: its traffic grows
with the group (measured: 22x a member's at 8 holders). Cut into K slices, slice j of round r reduced by the
(r + j)-th candidate of the agreed list (rotating, so the load moves from round to round), each node sends about its
frame and receives about one mean, plus, as a slice's reducer, (N - 1) / K frames in and as many means out: about twice
its frame per round, whatever N (docs/ARCHITECTURE.md, "A round in slices").

A slice is a unit of the round rule as a module is (`unit_id`): its own (unit, round) in the exchange, one version
of it, the stance and failover rules over its rotated list, late and failed on its own, its frames kept and audited
on their own, its digest after (`view`: the slice of the module's state is an `OuterState` of its own, whose digest
covers the slice's anchor and momentum). The module stays the unit of everything outside a round (its state, digest,
announcements, downloads, checkpoints): node/train/round.py `settle_slices` puts a round's slices back together.

Pure: no network, no clock. K = 1 is the single reducer, and its unit id is the module's own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from pathswarm.protocol.rounds.outer import OuterState

SLICE_ALIGN = 4096
"""Slice boundaries fall on multiples of this many values: the int8 codec's blocks and the sparse codec's chunks
(both 4096 by default) are then those of the whole module, and no slice is smaller than one block."""
UNIT_SEP = "/"
"""A slice's unit id is `module[j/K]`: readable in logs, and no module id holds '['."""


@dataclass(frozen=True)
class Unit:
    """One unit of a round: a whole module (k = 1) or its slice j of k, values [lo, hi)."""

    module: str
    j: int
    k: int
    lo: int
    hi: int

    @property
    def id(self) -> str:
        return unit_id(self.module, self.j, self.k)

    @property
    def numel(self) -> int:
        return self.hi - self.lo


def slice_count(numel: int, agreed: tuple[str, ...], cap: int) -> int:
    """How many slices a module's round has: the spec's cap, at most one per candidate of the agreed list (the last
    round's members: every one of them reduces a slice) and one per SLICE_ALIGN values. Every member that holds the
    same state holds the same list, so all count the same K. Before any result names a list (round 0) the caller
    passes the holders in the claims (reducers.py rule 5, `agreed_list`)."""
    if cap <= 1 or len(agreed) <= 1:
        return 1
    return max(1, min(cap, len(agreed), numel // SLICE_ALIGN))


def slice_bounds(numel: int, k: int) -> list[tuple[int, int]]:
    """[lo, hi) of each of k slices: about equal, boundaries on multiples of SLICE_ALIGN (the last takes the rest)."""
    if k <= 1:
        return [(0, numel)]
    blocks = -(-numel // SLICE_ALIGN)
    if k > blocks:
        raise ValueError(f"{k} slices of {numel} values: fewer than one block of {SLICE_ALIGN} each")
    edges = [min(numel, (blocks * j // k) * SLICE_ALIGN) for j in range(k)] + [numel]
    return list(zip(edges[:-1], edges[1:], strict=True))


def unit_id(module: str, j: int, k: int) -> str:
    return module if k == 1 else f"{module}[{j}{UNIT_SEP}{k}]"


def units_of(module: str, numel: int, k: int) -> list[Unit]:
    return [Unit(module, j, k, lo, hi) for j, (lo, hi) in enumerate(slice_bounds(numel, k))]


def parse_unit(uid: str, numels: Mapping[str, int], cap: int) -> Unit | None:
    """The unit a (peer's) id names, or None when it names none of our modules, or a slicing the spec does not allow
    (k above `cap`, j out of range, slices smaller than a block)."""
    if uid in numels:
        return Unit(uid, 0, 1, 0, numels[uid])
    module, bracket, rest = uid.partition("[")
    if not bracket or module not in numels or not rest.endswith("]"):
        return None
    j_text, sep, k_text = rest[:-1].partition(UNIT_SEP)
    if not (sep and j_text.isdigit() and k_text.isdigit()) or len(j_text) > 3 or len(k_text) > 3:
        return None
    j, k = int(j_text), int(k_text)
    numel = numels[module]
    if not (2 <= k <= cap and j < k and k <= -(-numel // SLICE_ALIGN)) or uid != unit_id(module, j, k):
        return None  # the last check refuses '01' for '1': one unit, one id
    lo, hi = slice_bounds(numel, k)[j]
    return Unit(module, j, k, lo, hi)


def rotated(agreed: tuple[str, ...], round_: int, j: int) -> tuple[str, ...]:
    """The failover order of slice j of round `round_`: the agreed list, starting at its (round + j)-th candidate.
    With K ≤ len(agreed), the K slices of a round have K different first candidates, and each round moves them."""
    if not agreed:
        return agreed
    start = (round_ + j) % len(agreed)
    return agreed[start:] + agreed[:start]


def slice_index(uid: str) -> int:
    """j of a slice's unit id (0 for a whole module's)."""
    _, bracket, rest = uid.partition("[")
    return int(rest.partition(UNIT_SEP)[0]) if bracket else 0


def agreed_list(mine: OuterState, uid: str, genesis: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
    """The failover order of a unit's round: the one its state names (`view`), or before any result named one (round
    0) the module's holders in the claims (reducers.py rule 5, `genesis`), rotated for slice j as a named list is.
    Round 0 is then cut into slices too, each with its own first reducer: with one reducer for the whole round 0 it
    sent every member the mean and served every member's check of it alone (issue 29: the slowest round on home
    links). A member, the slice's reducer and a candidate asked its stance all derive the same order from it."""
    if mine.reducers:
        return mine.reducers
    listed = tuple(genesis.get(module_of_unit(uid), ()))
    return rotated(listed, mine.round, slice_index(uid)) if UNIT_SEP in uid else listed


def view(state: OuterState, unit: Unit) -> OuterState:
    """The state of one unit: the module's state for a whole module; for a slice, its anchor and momentum (views, not
    copies: states are immutable), the module's round, and the rotated list (`rotated`) as its reducers. Its digest
    covers the slice only: what the slice's reducer and members compare."""
    if unit.k == 1:
        return state
    return OuterState(state.anchor[unit.lo:unit.hi], state.momentum[unit.lo:unit.hi], state.round,
                      rotated(state.reducers, state.round, unit.j))


class UnitNumels(Mapping[str, int]):
    """The exchange's module sizes, answering for slice units too: `uid in numels` and `numels[uid]` accept a unit id
    (`parse_unit`); iteration yields the modules only. Every bound of the round (frame limits, known modules) then
    holds per unit, unchanged."""

    def __init__(self, numels: Mapping[str, int], cap: int):
        self.modules, self.cap = dict(numels), cap

    def unit(self, uid: str) -> Unit | None:
        return parse_unit(uid, self.modules, self.cap)

    def __getitem__(self, uid: str) -> int:
        unit = self.unit(uid)
        if unit is None:
            raise KeyError(uid)
        return unit.numel

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, str) and self.unit(uid) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.modules)

    def __len__(self) -> int:
        return len(self.modules)


def module_of_unit(uid: str) -> str:
    """The module a unit id belongs to (the id itself for a whole module)."""
    return uid.partition("[")[0]


class UnitStates:
    """`state_of` for units: a slice's view of the module's current state, made once per (state, unit) and kept
    while the state is current (its digest is then hashed once, by the member and the reducer alike)."""

    def __init__(self, state_of: Callable[[str], OuterState | None], numels: UnitNumels):
        self.module_state, self.numels = state_of, numels
        self._views: dict[str, tuple[OuterState, OuterState]] = {}

    def __call__(self, uid: str) -> OuterState | None:
        unit = self.numels.unit(uid)
        if unit is None:
            return None
        state = self.module_state(unit.module)
        if state is None or unit.k == 1:
            return state
        kept = self._views.get(uid)
        if kept is not None and kept[0] is state:
            return kept[1]
        made = view(state, unit)
        self._views[uid] = (state, made)
        return made
