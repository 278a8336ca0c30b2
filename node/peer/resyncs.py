"""The re-syncs a node has been asked to do: one owner for the requests, whoever makes them.

Three things ask for a module's state to be replaced: a round whose digest is not the group's, or a reducer that
answers "out of sync" (a hint to check, never a source: node/peer/rounds.py); a contribution that says we are
behind, or a majority that vouches for another state (node/peer/state_sync.py); a split round whose version of ours
lost (node/peer/splits.py). They are recorded here, and StateSync.resync carries them out at the next poll. Until
then the module sends no outer gradient: its steps carry over to the round after the re-sync. Training thread only.
"""

from __future__ import annotations

from dataclasses import dataclass

from pathswarm.node.peer.vouch import Vouched


@dataclass(frozen=True)
class Resync:
    """Download `module` from `peer` (then, when `expect` is given, from its other announcers), keeping our progress."""

    module: str
    peer: str
    expect: Vouched | None = None
    """The state the download must be (round, digest, reducer list), when a majority vouched for it."""


class Resyncs:
    """Re-syncs requested and not done yet, by module."""

    def __init__(self):
        self._from: dict[str, str] = {}  # module → the peer to download it from
        self._expect: dict[str, Vouched] = {}  # module → the state that download must yield
        self._check: dict[str, str] = {}  # module → the peer (a reducer) that says our state is not the group's

    def request_from(self, mid: str, peer: str, expect: Vouched | None = None) -> None:
        """Download `mid` from `peer` at the next poll; `expect`: the state a majority vouches for (kept from an earlier
        request when None)."""
        self._from[mid] = peer
        if expect is not None:
            self._expect[mid] = expect

    def request_check(self, mid: str, peer: str) -> None:
        """`peer` says our state of `mid` is not the group's: a hint, never a source. The node re-syncs only to a
        state a majority of the module's holders announce (StateSync.resync)."""
        self._check[mid] = peer

    def checks(self) -> list[tuple[str, str]]:
        """(module, the peer that said so) of the checks still open."""
        return list(self._check.items())

    def close_check(self, mid: str) -> None:
        del self._check[mid]

    def take(self) -> list[Resync]:
        """The downloads to do now; they are no longer pending."""
        out = [Resync(mid, peer, self._expect.pop(mid, None)) for mid, peer in self._from.items()]
        self._from.clear()
        return out

    def pending(self, mid: str) -> bool:
        """A re-sync of `mid` is requested or being checked: its next outer gradient waits for it."""
        return mid in self._from or mid in self._check
