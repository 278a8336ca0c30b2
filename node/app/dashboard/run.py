"""Where a dashboard gets its figures, and serving one until the user stops it.

`swarm_poll` reads the swarm's records through any DHT peer of it (a client started for `swarm dashboard` and the
demo, the node's own for `node run --dashboard`); `node_poll` reads a running node's live status.
"""

from __future__ import annotations

import ipaddress
import logging
import signal
import threading
from collections.abc import Callable

from pathswarm.node.app.dashboard.view import node_view
from pathswarm.node.peer.config import read_live
from pathswarm.protocol.spec import SwarmSpec

logger = logging.getLogger(__name__)


def swarm_poll(spec: SwarmSpec, sdht: Callable[[], object | None]) -> Callable[[], dict]:
    """A poll of `swarm status`'s summary through the DHT peer `sdht()` returns (None: not started yet)."""
    from pathswarm.protocol.swarm_view import collect_view, summarize

    def poll() -> dict:
        net = sdht()
        if net is None:
            raise RuntimeError("not connected to the swarm yet")
        return summarize(spec, collect_view(net, spec))

    return poll


def node_poll(status) -> Callable[[], dict]:
    """The node's own view from its live status; the training thread changes the status meanwhile, so a copy that
    meets a dict being resized is taken again."""
    return lambda: read_live(lambda: node_view(status), tries=6)


def check_host(host: str) -> None:
    """Warn when the page is served beyond this machine (it is read-only, and shows what the swarm's records say)."""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        logger.warning("the dashboard listens on %s: anyone who can reach this machine can read it", host)


def serve_until_stopped(stop: threading.Event | None = None) -> None:
    """Block until Ctrl-C or SIGTERM."""
    stop = stop or threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
