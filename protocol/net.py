"""The one seam to hivemind: a peer's DHT and the p2p daemon under it (start, stop, values, streams).

`start_net` starts hivemind's DHT process (which runs p2pd), joins `initial_peers` and returns a
`SwarmNet`: this peer's id and addresses, DHT time, plain values stored and read under keys and
signed subkeys, and libp2p streams to other peers (`PeerStreams`). The node, the joiner and the
bootstrap peer all start through it. When the daemon or the DHT cannot start, it raises one of the
`NetStartError`s below, whose message tells the user what to check; hivemind's and p2pd's own error
text is inspected here, once, and nowhere else.

Together with protocol/_hivemind_records.py (the record validator the DHT process runs), this is the
only code that imports hivemind: the rest of pathswarm reaches the network through these names.

Identity: `start_net` hands one RSA key to p2pd (as hivemind's `identity_path`) and to the record
signatures, so a record's `peer_id` can be checked against the key that signed it. A node that keeps
its identity file across restarts keeps its peer id and its subkey.

Network: p2pd listens on `host_maddrs` (default 127.0.0.1, port 0) with NAT port mapping, AutoNAT,
relays and IPFS bootstrap off, so it contacts only the addresses it is given.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import re
import signal
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import hivemind
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.validation import RecordValidatorBase
from hivemind.p2p import P2P, PeerID
from hivemind.proto import crypto_pb2
from hivemind.utils import ValueWithExpiration, get_dht_time
from hivemind.utils.crypto import RSAPrivateKey
from multiaddr import Multiaddr

from pathswarm.protocol._hivemind_records import SwarmRecordValidator, peer_id_of_owner
from pathswarm.protocol.records import FIXED_TTL_S, served_key
from pathswarm.protocol.spec import SwarmSpec
from pathswarm.protocol.wire import NotServingYetError

LOOPBACK_MADDRS = ("/ip4/127.0.0.1/tcp/0",)
"""Where a peer listens unless told otherwise: loopback, a free port."""
SERVED_TTL_S = FIXED_TTL_S
"""How long a bootstrap peer's "I serve swarm X" lasts (it renews it well before)."""


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


def dht_time() -> float:
    """Seconds since the epoch, as every DHT peer stamps expirations (hivemind's DHT time)."""
    return get_dht_time()


# ---- identity files ----------------------------------------------------------------------------------
def generate_identity(path: str) -> None:
    """Write a fresh RSA libp2p identity (protobuf) to `path`, mode 0400."""
    P2P.generate_identity(path)


def peer_id_of_identity_bytes(data: bytes) -> str:
    """The peer id (base58) a libp2p identity file's bytes give; ValueError if they are not one."""
    try:
        return PeerID.from_identity(data).to_base58()
    except Exception:  # protobuf / key parsing raise assorted types
        raise ValueError("not a libp2p identity file") from None


def _load_identity(path: str) -> RSAPrivateKey:
    with open(path, "rb") as f:
        pb = crypto_pb2.PrivateKey.FromString(f.read())
    if pb.key_type != crypto_pb2.RSA:
        raise ValueError(f"{path}: identity is not an RSA key (hivemind's record signatures need one)")
    key = RSAPrivateKey.__new__(RSAPrivateKey)
    key.__setstate__({"_private_key": pb.data})  # hivemind's own unpickling: DER PKCS#1 → key
    return key


# ---- streams -------------------------------------------------------------------------------------------
StreamHandler = Callable[[str, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
"""(the caller's peer id, as libp2p authenticated it; reader; writer) → None. It must close the writer."""


class PeerStreams:
    """Binary libp2p streams to and from peers, over this peer's p2pd. Use it on the event loop that
    made it (`SwarmNet.streams()`)."""

    def __init__(self, p2p: P2P):
        self._p2p = p2p

    async def serve(self, name: str, handler: StreamHandler) -> None:
        """Answer streams opened to `name` with `handler`."""

        async def on_stream(info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await handler(info.peer_id.to_base58(), reader, writer)

        await self._p2p.add_binary_stream_handler(name, on_stream)

    async def serve_with_address(self, name: str, handler: Callable[[str, str, asyncio.StreamReader,
                                                                      asyncio.StreamWriter], Awaitable[None]]) -> None:
        """Like `serve`, the handler also getting the multiaddr the caller's connection comes from (as p2pd saw
        it: behind NAT, the router's address)."""

        async def on_stream(info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await handler(info.peer_id.to_base58(), str(info.addr), reader, writer)

        await self._p2p.add_binary_stream_handler(name, on_stream)

    async def open(self, peer_id: str, name: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Open a stream to `peer_id`'s handler `name`; NotServingYetError if the peer is up without that handler,
        other (assorted) types if it cannot be reached."""
        try:
            _, reader, writer = await self._p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), name)
        except Exception as e:
            if "protocols not supported" in str(e):  # p2pd's words when the protocol negotiation finds no handler
                raise NotServingYetError(f"{peer_id[-8:]} does not serve {name} (yet)") from None
            raise
        return reader, writer


# ---- a running peer -----------------------------------------------------------------------------------
class SwarmNet:
    """A running DHT peer and its p2p daemon, with the owner subkey its records are signed under."""

    def __init__(self, dht: hivemind.DHT, owner: bytes, peer_id: str, membership: str = ""):
        self.dht = dht
        """hivemind's DHT itself: for tests that attack hivemind directly."""
        self.owner = owner
        """`[owner:<ssh-rsa key>]`: the subkey of every record this peer writes."""
        self.peer_id = peer_id
        """This peer's libp2p id (base58), equal to `peer_id_of_owner(self.owner)`."""
        self.membership = membership
        """This peer's membership certificate (private swarms), attached to every record it writes."""
        self.client_mode = False
        """A client answers no DHT requests (it cannot be dialed): protocol/reachability.py."""
        self.reachable: bool | None = None
        """Whether a peer could dial this one back (None: not measured)."""

    def visible_maddrs(self) -> list[str]:
        """Multiaddrs other peers can join through (pass them as `initial_peers`)."""
        return [str(m) for m in self.dht.get_visible_maddrs()]

    @staticmethod
    def dht_time() -> float:
        return dht_time()

    def store(self, key: str, value: Any, expires_at: float, subkey: bytes | None = None) -> bool:
        """Store a msgpack-able value under key (and subkey: signed with our key when it is `self.owner`)
        until expires_at (DHT time); True if some peer accepted it."""
        return bool(self.dht.store(key, value, expires_at, subkey=subkey))

    def get(self, key: str, timeout_s: float | None = None) -> Any:
        """The newest value under key, None if there is none; a key written under subkeys gives
        {subkey: value}. Untrusted: whatever a peer stored. With timeout_s, raises TimeoutError when the
        DHT has not answered by then (a lookup that meets a dead peer waits for that peer's RPC timeout)."""
        if timeout_s is None:
            found = self.dht.get(key, latest=True)
        else:
            try:
                found = self.dht.get(key, latest=True, return_future=True).result(timeout=timeout_s)
            except concurrent.futures.TimeoutError:
                raise TimeoutError(f"the DHT did not answer within {timeout_s:g} s") from None
        value = getattr(found, "value", None)
        if isinstance(value, dict) and value and all(isinstance(v, ValueWithExpiration) for v in value.values()):
            return {subkey: item.value for subkey, item in value.items()}
        return value

    async def streams(self) -> PeerStreams:
        """Streams to and from peers over this peer's p2pd, for the calling event loop (await it there)."""
        return PeerStreams(await self.dht.replicate_p2p())

    # which swarm a bootstrap peer serves: read by a joiner before anything else
    def announce_served_swarm(self, spec: SwarmSpec) -> bool:
        """A bootstrap peer publishes the id and name of the swarm it serves (renew within SERVED_TTL_S), signed:
        nobody else can make joiners believe it serves another swarm."""
        value = {"swarm_id": spec.swarm_id, "name": spec.name[:200]}
        return self.store(served_key(self.peer_id), value, self.dht_time() + SERVED_TTL_S, subkey=self.owner)

    def served_swarm(self, peer_id: str) -> tuple[str, str] | None:
        """(swarm id, name) a bootstrap peer announced, or None (a plain DHT peer announces nothing). Only the entry
        signed by `peer_id` itself counts (a reader without the swarm's validator checks that here)."""
        found = self.get(served_key(peer_id))
        own = [v for k, v in found.items() if isinstance(k, bytes) and peer_id_of_owner(k) == peer_id] \
            if isinstance(found, dict) else []
        value = own[0] if len(own) == 1 else None
        if not isinstance(value, dict) or not isinstance(value.get("swarm_id"), str):
            return None
        swarm_id, name = value["swarm_id"], value.get("name")
        if not re.fullmatch(r"[0-9a-f]{64}", swarm_id):
            return None
        return swarm_id, name if isinstance(name, str) else ""

    def shutdown(self) -> None:
        self.dht.shutdown()

    def __enter__(self) -> SwarmNet:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


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
        return NoPeerAnsweredError(f"none of the initial peers answered within {waited_s:.0f} s (tried "
                                   f"{', '.join(initial_peers)}); check that a peer runs there, that the address "
                                   "(including its /p2p/ id) is current, and that no firewall blocks it")
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
    with tempfile.TemporaryDirectory(prefix="pathswarm-id-") as tmp:
        path = identity_path or os.path.join(tmp, "identity.key")
        if not os.path.isfile(path):
            generate_identity(path)  # an RSA key in libp2p's protobuf form, mode 0400
        private_key = _load_identity(path)
        validators: list[RecordValidatorBase] = [RSASignatureValidator(private_key)]
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
        )
        try:
            dht.wait_until_ready(timeout=startup_timeout_s)  # p2pd has read the identity file by now
        except BaseException:
            dht.shutdown()
            raise
    owner = RSASignatureValidator(private_key).local_public_key
    net = SwarmNet(dht, owner, dht.peer_id.to_base58(), membership)
    net.client_mode = client_mode
    return net


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
