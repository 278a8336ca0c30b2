"""Starting a peer: hivemind's DHT process and its p2pd, joined to `initial_peers`, or a typed error saying why not.

`start_net` hands one RSA key to p2pd (as hivemind's `identity_path`) and to the record signatures, so a
record's `peer_id` can be checked against the key that signed it. p2pd listens on `host_maddrs` (default
127.0.0.1, port 0) with NAT port mapping, AutoNAT, relays and IPFS bootstrap off, so it contacts only the
addresses it is given. When the daemon or the DHT cannot start, it raises one of the `NetStartError`s below,
whose message tells the user what to check; hivemind's and p2pd's own error text is inspected here, once,
and nowhere else.
"""

from __future__ import annotations

import os
import re
import signal
import tempfile
import threading
import time
from collections.abc import Sequence

import hivemind
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import RecordValidatorBase
from hivemind.utils.logging import use_hivemind_log_handler
from multiaddr import Multiaddr

from pathswarm.protocol.net.identity import generate_identity, load_identity
from pathswarm.protocol.net.swarm_net import SwarmNet
from pathswarm.protocol.net.validator import CachedSignatureValidator, SwarmRecordValidator, peer_id_of_owner
from pathswarm.protocol.spec import SwarmSpec

# hivemind's loggers propagate to ours (pathswarm/logs.py): one handler, one level (`-q` quiets them too), and JSON
# lines with `--log-format json`, instead of hivemind's own colored handler at its own level.
use_hivemind_log_handler("nowhere")

LOOPBACK_MADDRS = ("/ip4/127.0.0.1/tcp/0",)
"""Where a peer listens unless told otherwise: loopback, a free port."""


# ---- why a peer did not start ----------------------------------------------------------------------
class NetStartError(ValueError):
    """The DHT peer or its p2p daemon did not start; the message says what to check (the CLI prints it)."""


class PortInUseError(NetStartError):
    """Another process listens on the port asked for."""


class BadAddressError(NetStartError):
    """An address is not a multiaddr, an initial peer's lacks its /p2p/ id, or this machine has no such address."""


class NoPeerAnsweredError(NetStartError):
    """None of the initial peers could be reached."""


class DaemonStartError(NetStartError):
    """p2pd or the DHT process failed for another reason (the message quotes it)."""


class WrongSwarmError(NetStartError):
    """An initial peer is a bootstrap peer of another swarm."""


# ---- the start chain ------------------------------------------------------------------------------------
def start_net(
    initial_peers: Sequence[str] = (),
    host_maddrs: Sequence[str] | None = None,
    *,
    spec: SwarmSpec | None = None,
    identity_path: str | None = None,
    announce_maddrs: Sequence[str] | None = None,
    client_mode: bool = False,
    startup_timeout_s: float = 30.0,
    membership: str = "",
) -> SwarmNet:
    """Start a DHT peer and join `initial_peers` (none: start a new DHT); raises a NetStartError saying why not.

    `host_maddrs` defaults to loopback on a free port. `spec` installs the swarm's record validator
    (a bootstrap peer serving many swarms would pass None and check signatures only), and refuses an
    initial peer that serves another swarm (WrongSwarmError). `identity_path` is an RSA identity file,
    created if missing (keep it in the user's data directory); without one a fresh identity is made for
    this run. `membership` is this peer's certificate in a private swarm (checked by the caller).
    """
    if isinstance(initial_peers, str):
        raise TypeError("initial_peers is a list of multiaddrs, not one string")
    host = list(host_maddrs or LOOPBACK_MADDRS)
    _check_addresses(list(initial_peers), host, list(announce_maddrs or ()))
    t0 = time.monotonic()
    try:
        net = _start(initial_peers, host, spec=spec, identity_path=identity_path, announce_maddrs=announce_maddrs,
                     client_mode=client_mode, startup_timeout_s=startup_timeout_s, membership=membership)
    except Exception as e:  # p2pd and hivemind raise several types for the same few causes
        raise _start_error(e, list(initial_peers), host, time.monotonic() - t0) from e
    if spec is not None:
        try:
            _refuse_other_swarm(net, spec, initial_peers)
        except BaseException:
            net.shutdown()
            raise
    return net


def _check_addresses(initial_peers: list[str], host: list[str], announce: list[str]) -> None:
    """Refuse what is not a multiaddr before p2pd sees it (one of them once made the start hang for 30 s)."""
    for option, maddrs in (("--initial-peer", initial_peers), ("--host-maddr", host), ("--announce-maddr", announce)):
        for text in maddrs:
            if not text.strip():  # `--initial-peer ""` (an unset shell variable): say so, not "not a multiaddr"
                raise BadAddressError(f"{option} is empty: give a multiaddr such as /ip4/203.0.113.7/tcp/31337"
                                      + ("/p2p/<peer id>, as the peer printed it" if option == "--initial-peer"
                                         else ""))
            try:
                maddr = Multiaddr(text)
            except Exception as e:  # multiaddr's parse errors
                why = re.sub(r" \(string: .*\)$", "", re.sub(r"^Invalid MultiAddr '.*?': ", "", str(e)))
                raise BadAddressError(f"{option} {text!r} is not a multiaddr ({why}); one looks like "
                                      "/ip4/203.0.113.7/tcp/31337") from None
            protocols = [p.name for p in maddr.protocols()]
            if option == "--initial-peer" and "p2p" not in protocols:
                raise BadAddressError(f"{option} {text} has no /p2p/<peer id> at its end: use the full address "
                                      "the peer printed")
            if option == "--announce-maddr" and "tcp" in protocols and maddr.value_for_protocol("tcp") == "0":
                raise BadAddressError(f"{option} {text}: give the port other machines reach this peer at, not 0")


def _start_error(e: Exception, initial_peers: list[str], host: list[str], waited_s: float) -> NetStartError:
    """The one place p2pd's and hivemind's error text is read: what went wrong, as a typed error."""
    text = str(e)
    low = text.lower()
    detail = text.splitlines()[-1] if text.strip() else type(e).__name__
    detail = re.sub(r"^Daemon failed to start: (\d{4}/\d\d/\d\d \d\d:\d\d:\d\d )?", "", detail)
    listening = ", ".join(host)
    if "address already in use" in low:
        return PortInUseError(f"cannot listen on {listening}: the port is in use; pick another --host-maddr port "
                              "or use port 0")
    if "cannot assign requested address" in low:
        return BadAddressError(f"cannot listen on {listening}: this machine has no such address; listen on one it "
                               "has (or /ip4/0.0.0.0/tcp/PORT) and give the public one with --announce-maddr")
    if "failed to listen" in low or "bind:" in low:
        return BadAddressError(f"cannot listen on {listening}: {detail}")
    if "failed to parse multiaddr" in low or "invalid p2p multiaddr" in low or "announce_maddrs" in low:
        return BadAddressError(f"bad address: {detail}")
    if initial_peers and (isinstance(e, TimeoutError) or "bootstrap" in low or "initial" in low or "connect" in low):
        # A refusal comes back at once ("within 0 s" read as if we had not waited); silence takes the whole timeout.
        how = ("no initial peer could be reached: the connection failed at once" if waited_s < 1
               else f"none of the initial peers answered within {waited_s:.0f} s")
        return NoPeerAnsweredError(f"{how} (tried {', '.join(initial_peers)}); check that a peer runs there, that "
                                   "the address (including its /p2p/ id) is current, and that no firewall blocks it")
    if isinstance(e, TimeoutError):
        return DaemonStartError(f"the DHT peer did not start within {waited_s:.0f} s")
    return DaemonStartError(f"the DHT peer did not start: {detail}")


def _refuse_other_swarm(net: SwarmNet, spec: SwarmSpec, initial_peers: Sequence[str]) -> None:
    for maddr in initial_peers:
        if "/p2p/" not in maddr:
            continue
        served = net.served_swarm(maddr.rsplit("/p2p/", 1)[1])
        if served is not None and served[0] != spec.swarm_id:
            raise WrongSwarmError(f"the peer {maddr} serves swarm {served[1]!r} (id {served[0][:16]}…) but your "
                                  f"spec's swarm id is {spec.swarm_id[:16]}…: use that swarm's spec file")


def _start(
    initial_peers: Sequence[str],
    host_maddrs: Sequence[str],
    *,
    spec: SwarmSpec | None,
    identity_path: str | None,
    announce_maddrs: Sequence[str] | None,
    client_mode: bool,
    startup_timeout_s: float,
    membership: str,
) -> SwarmNet:
    """hivemind's DHT with our options; hivemind's and p2pd's own exceptions pass through."""
    # p2pd (go-libp2p 0.32) dials out from its listening port by default (SO_REUSEPORT). Two peers that dial each
    # other at the same moment then make one TCP connection by simultaneous open, on which both act as the
    # initiator: the security handshake fails and both dials fail ("all dials failed"), and each retry collides
    # again. A round in slices makes peers that never spoke dial each other at once (round 0: slice reducers and
    # members both ways; measured on home links, 16 nodes: two pairs could not reach each other for the whole of
    # round 0, and the slices they reduced split). Dialing from ephemeral ports, the two dials are two connections,
    # which libp2p keeps both of. Reuse only helps hole punching through NAT, which we do not use (relays and
    # AutoNAT are off; clients dial out). The daemons inherit this from the process (the DHT's and ours).
    os.environ.setdefault("LIBP2P_TCP_REUSEPORT", "false")
    with tempfile.TemporaryDirectory(prefix="pathswarm-id-") as tmp:
        path = identity_path or os.path.join(tmp, "identity.key")
        if not os.path.isfile(path):
            generate_identity(path)  # an RSA key in libp2p's protobuf form, mode 0400
        private_key = load_identity(path)
        validators: list[RecordValidatorBase] = [CachedSignatureValidator(private_key)]
        owner = validators[0].local_public_key
        if spec is not None:
            validators.append(SwarmRecordValidator(spec))
        dht = ParentBoundDHT(
            initial_peers=list(initial_peers),
            start=True,
            record_validators=validators,
            client_mode=client_mode,
            # p2pd: listen where told; never map ports, probe reachability, relay or reach IPFS.
            host_maddrs=list(host_maddrs),
            announce_maddrs=list(announce_maddrs) if announce_maddrs else None,
            identity_path=path,
            # hivemind's identity check starts a second p2pd with AutoNAT and NAT port mapping on
            # (it forwards none of the options here): never. A persistent identity must be guarded
            # by the caller (one node per data directory).
            check_if_identity_free=False,
            use_relay=False,
            use_auto_relay=False,
            auto_nat=False,
            nat_port_map=False,
            use_ipfs=False,
            await_ready=False,
            node_id=dht_node_id(owner),
        )
        try:
            dht.wait_until_ready(timeout=startup_timeout_s)  # p2pd has read the identity file by now
        except KeyboardInterrupt:
            # Ctrl-C while the DHT process is still starting: it cannot answer a graceful stop yet (hivemind waits
            # 3 s for it, then terminates it), so terminate it almost at once.
            dht.shutdown_timeout = STOP_STARTING_S
            dht.shutdown()
            raise
        except BaseException:
            dht.shutdown()
            raise
    net = SwarmNet(dht, owner, dht.peer_id.to_base58(), membership)
    net.client_mode = client_mode
    net.search_beam = SEARCH_BEAM
    return net


def dht_node_id(owner: bytes) -> DHTID | None:
    """The DHT node id of a peer: derived from its peer id, so that a node restarted with the same identity keeps it.

    hivemind draws a random node id per start. Peers then kept the dead run's node id in their routing tables next
    to the new one, both pointing at the same peer id: a store went to the restarted process twice, the second copy
    (same expiration) was refused as "not newer", and hivemind reported the whole store as failed although it was
    stored (every record of every peer whose key lay near the restarted node's ids, for as long as the stale entry
    lived). One node id per identity replaces the stale entry instead. It gives an attacker nothing: placing a
    node id near a key now means grinding RSA keys, where hivemind lets a peer pick any id."""
    peer_id = peer_id_of_owner(owner)
    return None if peer_id is None else DHTID.generate(source=f"pathswarm-dht-node:{peer_id}".encode())


SEARCH_BEAM: int | None = None
"""How many of the nearest peers a search of the DHT keeps asking; None: hivemind's bucket size, 20, which in a swarm
under 20 peers means every peer on every store and read. 10 (twice the 5 a record is stored on) cut the DHT's and
p2pd's CPU per node and round to 0.54 × at 32 peers (benchmarks/dht_load.py, with one store a round), but with it the
16-node test on home links (tests/swarm/test_home_links.py) found a node missing from a round it did not count as
late or failed, which it never did with 20: kept at hivemind's until a narrower beam is shown to leave no reader
with a partial view of the claims (a reader's beam must reach the peers the writers stored on; right after a
swarm forms their routing tables differ)."""
STOP_STARTING_S = 0.3
"""How long a DHT process interrupted while starting gets to stop by itself before it is terminated."""
PARENT_POLL_S = 0.5  # how often the DHT process checks that the process that started it is alive


class ParentBoundDHT(hivemind.DHT):
    """hivemind's DHT process, which also ends, with its p2pd, when the process that started it dies.

    hivemind forks the DHT into a child that runs p2pd. A node killed with SIGKILL (or by the OOM
    killer) never shuts that child down: it stayed up for good, answering DHT requests as the dead
    node, and p2pd kept its peer id online: peers could still choose the dead node as reducer, and a
    restart with the same identity ran next to its own ghost."""

    def run(self) -> None:  # runs in the forked child
        # A parent that installed a Python SIGTERM handler before forking us (the bootstrap peer did) would
        # leave us a copy that only sets the parent's stop flag: SIGTERM then could not stop this process, and
        # the parent's exit blocked on joining it. Our stop is the default one.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        parent = os.getppid()
        threading.Thread(target=self._exit_with_parent, args=(parent,), name="pathswarm-parent-watch",
                         daemon=True).start()
        super().run()

    def _exit_with_parent(self, parent: int) -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        node = getattr(self, "_node", None)
        daemon = getattr(getattr(node, "p2p", None), "_child", None)  # hivemind's p2pd process (asyncio)
        if daemon is not None and daemon.returncode is None:
            try:
                os.kill(daemon.pid, signal.SIGTERM)
                for _ in range(20):
                    if os.waitpid(daemon.pid, os.WNOHANG)[0]:
                        break
                    time.sleep(0.1)
                else:
                    os.kill(daemon.pid, signal.SIGKILL)
            except (ProcessLookupError, ChildProcessError):
                pass
        os._exit(0)
