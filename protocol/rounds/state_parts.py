"""A module's state in parts: which values part j of K holds, so that a joiner downloads the parts from several holders
at once (issue 28, item 5) instead of the whole state from one holder's uplink.

A state on the wire is its anchor then its momentum, fp32 (protocol/rounds/service.py `_on_state`): 2·numel values.
Part j of K is a contiguous range of them, the K ranges cut at multiples of ALIGN values and as equal as that allows.
Pure: no networking, no torch.
"""

from __future__ import annotations

MAX_STATE_PARTS = 64
"""The most parts a state is asked in (bounds what a request may make a server compute)."""
ALIGN = 1024
"""Values: part boundaries fall on multiples of it (4 KiB of fp32), but the last."""
FLOOR_BYTES_PER_S = 125_000
"""The slowest state transfer waited for to its end (1 Mbit/s): a transfer's deadline grows with its size at this
rate. A fixed deadline (the averaging timeout, 20 s) made any state over ~50 MB impossible to download from one home
uplink of 20 Mbit/s: a 25 M-parameter path (204 MB of anchor and momentum) never synced. A stalled transfer is still
found within the averaging timeout: nothing may arrive for that long (protocol/wire.py `idle_s`)."""


def transfer_deadline_s(timeout_s: float, nbytes: int) -> float:
    """How long a state transfer of `nbytes` may take, end to end: the averaging timeout plus its bytes at
    FLOOR_BYTES_PER_S."""
    return timeout_s + nbytes / FLOOR_BYTES_PER_S


def part_bounds(total: int, parts: int, part: int) -> tuple[int, int]:
    """[start, end) of the values part `part` of `parts` holds, of a state of `total` values. Every value is in
    exactly one part; a part may be empty when there are more parts than ALIGN blocks."""
    if not 1 <= parts <= MAX_STATE_PARTS or not 0 <= part < parts:
        raise ValueError(f"part {part} of {parts} (1 to {MAX_STATE_PARTS} parts)")
    if total < 0:
        raise ValueError(f"a state of {total} values")
    blocks = -(-total // ALIGN)

    def edge(j: int) -> int:
        return min(total, (blocks * j // parts) * ALIGN)

    return edge(part), edge(part + 1) if part + 1 < parts else total


def parts_for(servers: int, total: int) -> int:
    """How many parts to ask for with `servers` holders to download from: one per holder, at most MAX_STATE_PARTS,
    and no more than the state has ALIGN blocks."""
    return max(1, min(servers, MAX_STATE_PARTS, -(-total // ALIGN)))
