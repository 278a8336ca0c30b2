"""protocol/net/start.py's start chain: each way a peer fails to start is its own typed error, with a message
that says what to check; a peer of another swarm is refused. Real p2pd daemons on 127.0.0.1 only."""

import asyncio
import socket

import pytest

from pathswarm.protocol.net import (
    BadAddressError,
    DaemonStartError,
    NetStartError,
    NoPeerAnsweredError,
    PeerStreams,
    PortInUseError,
    SwarmNet,
    WrongSwarmError,
    _start_error,
    start_net,
)
from pathswarm.protocol.netloop import NetLoop
from pathswarm.protocol.spec import SwarmSpec
from pathswarm.protocol.wire import read_message, write_message

pytestmark = pytest.mark.timeout(90)

SPEC = SwarmSpec(name="net-test", levels=(2, 2))
OTHER = SwarmSpec(name="other-swarm", levels=(2, 2))
DEAD = "/ip4/127.0.0.1/tcp/9/p2p/QmQycYEeJ8hLdKTpsCAAputNjZYvdZWANTaRF9kNuXrBpe"


def test_a_port_in_use_is_a_port_in_use_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(PortInUseError, match=f"cannot listen on /ip4/127.0.0.1/tcp/{port}: the port is in use"):
            start_net(host_maddrs=[f"/ip4/127.0.0.1/tcp/{port}"])


def test_an_initial_peer_that_does_not_answer_is_a_no_peer_answered_error():
    # nothing listens there: refused at once, which the message says instead of "answered within 0 s"
    with pytest.raises(NoPeerAnsweredError, match="no initial peer could be reached: the connection failed at once") \
            as e:
        start_net([DEAD])
    assert DEAD in str(e.value) and "/p2p/ id" in str(e.value) and "within 0 s" not in str(e.value)


@pytest.mark.parametrize("kwargs, words", [
    (dict(host_maddrs=["/ip4/999.1.1.1/tcp/0"]), "--host-maddr '/ip4/999.1.1.1/tcp/0' is not a multiaddr"),
    (dict(initial_peers=["garbage"]), "--initial-peer 'garbage' is not a multiaddr"),
    (dict(initial_peers=["/ip4/127.0.0.1/tcp/9"]), "has no /p2p/<peer id>"),
    (dict(initial_peers=[""]), "--initial-peer is empty: give a multiaddr such as /ip4/"),
    (dict(announce_maddrs=["nonsense"]), "--announce-maddr 'nonsense' is not a multiaddr"),  # once hung for 30 s
    (dict(announce_maddrs=["/ip4/203.0.113.7/tcp/0"]), "not 0"),
    (dict(host_maddrs=["/ip4/203.0.113.7/tcp/0"]), "this machine has no such address"),  # p2pd's bind fails
])
def test_a_bad_address_is_a_bad_address_error(kwargs, words):
    with pytest.raises(BadAddressError) as e:
        start_net(**kwargs)
    assert words in str(e.value) and "\n" not in str(e.value)
    assert isinstance(e.value, NetStartError) and isinstance(e.value, ValueError)  # the CLI prints it in one line


@pytest.mark.parametrize("error, initial, kind, words", [
    (RuntimeError("DHTNode bootstrap failed: none of the initial_peers responded to a ping."), [DEAD],
     NoPeerAnsweredError, "none of the initial peers answered within 12 s (tried " + DEAD),
    (TimeoutError(), [DEAD], NoPeerAnsweredError, "none of the initial peers answered within 12 s"),
    (TimeoutError(), [], DaemonStartError, "the DHT peer did not start within 12 s"),
    (RuntimeError("Daemon failed to start: 2026/12/04 10:29:03 something odd\n"), [], DaemonStartError,
     "the DHT peer did not start: something odd"),
    (RuntimeError("Daemon failed to start: 2026/12/04 10:29:00 failed to listen on any addresses: [listen tcp4 "
                  "127.0.0.1:80: bind: permission denied]"), [], BadAddressError, "bind: permission denied"),
])
def test_what_p2pd_and_hivemind_say_becomes_one_typed_error(error, initial, kind, words):
    typed = _start_error(error, initial, ["/ip4/127.0.0.1/tcp/80"], waited_s=12.3)
    assert type(typed) is kind and words in str(typed) and "\n" not in str(typed)


def test_an_initial_peer_serving_another_swarm_is_refused_and_a_peer_of_ours_is_joined():
    with start_net(spec=OTHER) as boot:
        assert boot.announce_served_swarm(OTHER)
        with pytest.raises(WrongSwarmError, match="serves swarm 'other-swarm'.*use that swarm's spec file"):
            start_net(boot.visible_maddrs(), spec=SPEC)
        with start_net(boot.visible_maddrs(), spec=OTHER, client_mode=True) as joiner:
            assert isinstance(joiner, SwarmNet) and joiner.served_swarm(boot.peer_id) == (OTHER.swarm_id, OTHER.name)
            assert joiner.peer_id != boot.peer_id and joiner.dht_time() > 1.7e9


def test_values_and_streams_between_two_peers():
    with start_net() as a, start_net(a.visible_maddrs()) as b:
        expires = a.dht_time() + 30
        assert a.store("net-test/plain", {"x": 1}, expires)
        assert a.store("net-test/signed", "mine", expires, subkey=a.owner)
        assert b.get("net-test/plain") == {"x": 1}
        assert b.get("net-test/signed", timeout_s=10) == {a.owner: "mine"}  # subkey → value, no hivemind types
        assert b.get("net-test/nothing") is None

        async def who_calls(caller: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await write_message(writer, {"caller": caller, "said": (await read_message(reader, 0))[0]["say"]})
            writer.close()

        async def call(streams: PeerStreams) -> dict:
            reader, writer = await streams.open(a.peer_id, "net-test.who")
            try:
                await write_message(writer, {"say": "hello"})
                return (await read_message(reader, 0))[0]
            finally:
                writer.close()

        loop_a, loop_b = NetLoop("test-a"), NetLoop("test-b")
        try:
            served = loop_a.run(a.streams(), 30)
            loop_a.run(served.serve("net-test.who", who_calls), 30)
            reply = loop_b.run(call(loop_b.run(b.streams(), 30)), 30)
        finally:
            loop_a.stop()
            loop_b.stop()
    assert reply == {"caller": b.peer_id, "said": "hello"}  # the peer id libp2p authenticated, as a str
