"""The node's token counters across restarts: what its checkpoints and saved rounds in progress keep of them, and how
a restarted node continues them.

Every status file a node writes, mid-chunk or just before a kill included, holds

    tokens_trained = tokens_merged + tokens_unmerged + tokens_discarded + tokens_lost

(a step's tokens count as trained when the step ends, as the worker's round count does: `NodeStatus.stepped`;
tokens_unmerged is counted afresh at each write: node/peer/rounds.py `Rounds.unmerged_tokens`). A run that dies
(SIGKILL, a power cut) leaves on disk its last round checkpoint and its last saved round in progress, each with the
counters as of its save (`Counts`), and its last status file, written every 10 inner steps. The next run, with the
same peer id or a new one, continues from the newest of the three (`continued`): what earlier runs trained stays
trained, and every unmerged token it cannot take back moves to tokens_lost: steps trained after the last save,
outer gradients that were in flight (the restarted node cannot learn whether their round merged: the reducer's
tokens_reduced counts them if it did), carried steps of a round in progress it could not resume. The swarm's totals,
summed from the counts the nodes announce, do not drop when a node restarts.

`counters_id` names one node's counters across its runs: drawn when nothing saved names one, kept in every save and
in the status file, so that a status file another node (or an earlier life of the directory) left at the same path
is never continued. Without a checkpoint directory nothing is saved: each run starts its counters afresh.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

_ID_RE = re.compile(r"^[0-9a-f]{32}$")
MAX_TOKENS = 1 << 62  # a counter above this is not ours (the DHT records bound counts the same way)


def new_counters_id() -> str:
    return secrets.token_hex(16)


@dataclass(frozen=True)
class Counts:
    """The token counters a save keeps (the status file's `tokens_*` fields of the same name)."""

    counters_id: str
    trained: int = 0
    merged: int = 0
    discarded: int = 0
    lost: int = 0
    reduced: int = 0
    """Tokens of the shared module's rounds this node closed as their reducer."""
    reduced_discarded: int = 0

    @property
    def unmerged(self) -> int:
        return self.trained - self.merged - self.discarded - self.lost

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: Any) -> Counts | None:
        """Counts as `to_json` wrote them (a checkpoint manifest, a saved round); None when they are not."""
        if not isinstance(raw, dict):
            return None
        return cls._checked(raw.get("counters_id"), {f.name: raw.get(f.name, 0) for f in fields(cls)[1:]})

    @classmethod
    def from_status(cls, raw: Any) -> Counts | None:
        """The counts of a status file's JSON (node/peer/status.py `write_status`); None when it has none."""
        if not isinstance(raw, dict):
            return None
        return cls._checked(raw.get("counters_id"), {f.name: raw.get(f"tokens_{f.name}", 0) for f in fields(cls)[1:]})

    @classmethod
    def _checked(cls, counters_id: Any, counts: dict[str, Any]) -> Counts | None:
        if not isinstance(counters_id, str) or not _ID_RE.match(counters_id):
            return None
        if not all(type(v) is int and 0 <= v <= MAX_TOKENS for v in counts.values()):
            return None
        got = cls(counters_id, **counts)
        return got if got.unmerged >= 0 else None


def _age(c: Counts) -> tuple[int, ...]:
    """A key that grows with every change of one node's counts: trained, merged + discarded + lost, discarded,
    reduced + reduced_discarded and reduced_discarded each only grow (a healed split moves merged tokens to discarded,
    reduced ones to reduced_discarded; a restart moves unmerged ones to lost), so of two saves of one node the later
    has the larger key, and two saves with the same key hold the same counts."""
    return (c.trained, c.merged + c.discarded + c.lost, c.discarded, c.reduced + c.reduced_discarded,
            c.reduced_discarded)


def newest(*found: Counts | None) -> Counts | None:
    """The latest of one node's saved counts (those of another counters_id than the first found are ignored)."""
    present = [c for c in found if c is not None]
    if not present:
        return None
    return max((c for c in present if c.counters_id == present[0].counters_id), key=_age)


def continued(saved: Counts | None, last_status: Counts | None, resumed_unmerged: int,
              fresh_id: str | None = None) -> Counts:
    """The counts a starting node continues from. `saved`: the newest save of the checkpoint directory (None: none,
    so the node starts afresh under `fresh_id`); `last_status`: the counts of the last status file, used when it is
    the same node's and newer (the steps trained after the last save show only there); `resumed_unmerged`: the
    tokens of the round in progress this run took back (its steps and carried steps: they stay unmerged, counted
    trained once, by the run that trained them). Every other token the previous run had not merged nor discarded
    is lost."""
    if saved is None:
        return Counts(fresh_id or new_counters_id())
    base = saved
    if last_status is not None and last_status.counters_id == saved.counters_id:
        base = max(saved, last_status, key=_age)
    # A resumed round holds only unmerged tokens of the save it came from; should it ever hold more (a save that
    # does not match its round), its tokens are trained anyway: they are in the weights.
    trained = max(base.trained, base.merged + base.discarded + base.lost + resumed_unmerged)
    return replace(base, trained=trained, lost=trained - base.merged - base.discarded - resumed_unmerged)


def read_status_counts(path: str) -> Counts | None:
    """The counts of the status file at `path` ('' or none there, or unreadable: None)."""
    if not path:
        return None
    try:
        return Counts.from_status(json.loads(Path(path).read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None


def restart_counts(saved: list[Any], status_file: str, resumed_unmerged: int) -> Counts:
    """What a starting node continues: `saved` are the counters its checkpoint and its saved round in progress hold
    (as written, None where there are none), `status_file` the status file its previous run wrote (when the path is
    '' or the file is gone, the steps trained after the last save cannot be counted: neither trained nor lost)."""
    got = continued(newest(*(Counts.from_json(raw) for raw in saved if raw is not None)),
                    read_status_counts(status_file), resumed_unmerged)
    if got.trained:
        logger.info("counters continued: %d tokens trained, %d merged, %d lost (trained by an earlier run, not "
                    "merged, and not resumed: this run cannot take them back)", got.trained, got.merged, got.lost)
    return got
