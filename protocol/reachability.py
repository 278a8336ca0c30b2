"""Can peers dial this node? A dial-back from a peer it already reaches, and what a node that cannot be dialed does.

A node behind a home router (NAT without a forwarded port) can open connections but not accept them. Such a node
asks a peer it joined through (a bootstrap peer or any node) to dial it back: it sends the TCP ports it listens on,
and the peer tries a plain TCP connection to each, **at the address the request came from** (the router's public
address, as that peer saw it). The peer never dials an address the requester names, so the service cannot be used
to make a peer connect to a third party; its answer is rate-limited per caller.

- A port that accepts: the node is reachable.
- No port accepts: the node is behind NAT or a firewall. It runs as a **client**: its DHT peer answers no
  requests (hivemind's client mode) and its records say `client`, so its peers never make it a round's reducer,
  never ask it for state, and never count it as a reducer candidate. It still contributes to every round of its
  modules, receives each round's result on the stream it opened, and downloads state: every connection it needs it
  opens itself. No relay is needed for that, so none is used.
- No answer (no peer serves the dial-back, e.g. the first node of a new swarm): unknown, and the node serves as a
  reachable one.

`open_ports` is the peer side, `ask` the node side, `verdict` the pure decision.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass

from pathswarm.protocol.ratelimit import RateLimiter
from pathswarm.protocol.wire import WireError, read_message, write_message

logger = logging.getLogger(__name__)

DIALBACK_HANDLER = "/pathswarm/dialback/1.0.0"
MAX_PORTS = 8
"""Most ports one request may ask about (a node listens on one or two)."""
DIAL_TIMEOUT_S = 3.0
"""How long the peer waits for each TCP connection (a port behind NAT usually answers at once: refused)."""
ASK_TIMEOUT_S = 2 * DIAL_TIMEOUT_S + 5.0

_IP_RE = re.compile(r"^/(ip4|ip6)/([^/]+)/tcp/\d+")


def observed_host(maddr: str) -> str | None:
    """The IP address in a peer's observed multiaddr (/ip4/A/tcp/P or /ip6/A/tcp/P), None for anything else
    (a relayed or DNS address: nothing to dial back)."""
    m = _IP_RE.match(maddr)
    return m.group(2) if m else None


def parse_ports(header: dict) -> list[int]:
    """The ports a dial-back request asks about; WireError when malformed (from a stranger: bounded, checked)."""
    ports = header.get("ports")
    if not isinstance(ports, list) or not 1 <= len(ports) <= MAX_PORTS:
        raise WireError(f"ports must be a list of 1 to {MAX_PORTS} ports")
    if any(isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= 65535 for p in ports):
        raise WireError("a port must be an integer in [1, 65535]")
    return sorted(set(ports))


def listen_ports(maddrs: list[str]) -> list[int]:
    """The TCP ports of this node's visible multiaddrs (those it listens or is announced on)."""
    ports = {int(m.group(1)) for a in maddrs if (m := re.search(r"/tcp/(\d+)", a))}
    return sorted(p for p in ports if 1 <= p <= 65535)[:MAX_PORTS]


@dataclass(frozen=True)
class DialBack:
    peer: str
    """Who dialed."""
    observed: str
    """The address it saw us at, and dialed."""
    open: tuple[int, ...]
    """The ports that accepted its connection."""


def verdict(answers: list[DialBack]) -> bool | None:
    """Reachable when any peer connected to any port; not when peers answered and none connected; None (unknown)
    when no peer answered."""
    if not answers:
        return None
    return any(a.open for a in answers)


async def _connects(host: str, port: int, timeout_s: float) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (TimeoutError, OSError):
        return False
    writer.close()
    return True


class DialBackServer:
    """Answers dial-back requests: served by bootstrap peers and by every reachable node."""

    def __init__(self, dial_timeout_s: float = DIAL_TIMEOUT_S):
        self.dial_timeout_s = dial_timeout_s
        self.limiter = RateLimiter(rate=0.05, burst=3)  # a node asks once at start (twice if it retries)

    async def start(self, streams) -> None:
        await streams.serve_with_address(DIALBACK_HANDLER, self._on_request)

    async def _on_request(self, caller: str, address: str, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        try:
            # Read the request before any answer: a stream closed with its request unread may reset before the
            # caller has read our reply.
            header, _ = await read_message(reader, 0)
            if not self.limiter.allow(caller):
                await write_message(writer, {"status": "refused", "reason": "rate limited"})
                return
            ports = parse_ports(header)
            host = observed_host(address)
            if host is None:
                await write_message(writer, {"status": "refused", "reason": "no IP address to dial back"})
                return
            opened = await asyncio.gather(*(_connects(host, p, self.dial_timeout_s) for p in ports))
            await write_message(writer, {"status": "ok", "observed": host,
                                         "open": [p for p, ok in zip(ports, opened, strict=True) if ok]})
        except (WireError, ConnectionError, asyncio.IncompleteReadError) as e:
            logger.info("dial-back request from %s failed: %s", caller[-8:], e)
        finally:
            writer.close()


async def ask(streams, peer: str, ports: list[int], timeout_s: float = ASK_TIMEOUT_S) -> DialBack:
    """Ask `peer` to dial us back on `ports`; ValueError when it does not answer properly."""

    async def go():
        reader, writer = await streams.open(peer, DIALBACK_HANDLER)
        try:
            await write_message(writer, {"ports": ports})
            return await read_message(reader, 0)
        finally:
            writer.close()

    try:
        header, _ = await asyncio.wait_for(go(), timeout_s)
    except Exception as e:  # unreachable, no such handler (an older peer), timeout, malformed reply
        raise ValueError(f"{peer[-8:]} did not dial back ({type(e).__name__}: {str(e)[:120]})") from None
    if header.get("status") != "ok":
        raise ValueError(f"{peer[-8:]} refused to dial back: {str(header.get('reason'))[:120]}")
    opened = header.get("open")
    observed = header.get("observed")
    if not isinstance(opened, list) or not isinstance(observed, str) or any(p not in ports for p in opened):
        raise ValueError(f"{peer[-8:]} answered a malformed dial-back")
    return DialBack(peer=peer, observed=observed[:64], open=tuple(opened))


async def probe(streams, peers: list[str], ports: list[int], want: int = 1) -> list[DialBack]:
    """Ask `peers` in turn until `want` of them answered; the answers (empty: nobody did). Two answers keep one
    lying peer from deciding alone that we cannot be dialed (`verdict`: any connection means reachable)."""
    answers: list[DialBack] = []
    for peer in peers:
        try:
            answers.append(await ask(streams, peer, ports))
        except ValueError as e:
            logger.info("%s", e)
            continue
        if len(answers) >= want:
            break
    return answers
