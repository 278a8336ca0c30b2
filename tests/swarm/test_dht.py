"""protocol/dht.py on a real hivemind DHT: three peers in this process's children, on 127.0.0.1 only.

Claims travel between peers, nobody can overwrite or forge another peer's claim (not even a peer
running without validators), expired claims vanish. Run it under `unshare -n` (with `ip link set lo
up`) to prove no address outside loopback is needed.
"""

import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
import types

import hivemind
import pytest
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import CompositeValidator, DHTRecord
from hivemind.utils import MSGPackSerializer, ValueWithExpiration, get_dht_time
from hivemind.utils.crypto import RSAPrivateKey

from pathswarm.protocol.dht import (
    SwarmRecordValidator,
    announce_module,
    announcement_entry,
    metrics_entry,
    peer_id_of_owner,
    publish_claim,
    publish_entries,
    publish_metrics,
    read_claims,
    read_metrics,
    read_module_holders,
    read_modules_holders,
    withdraw_claim,
)
from pathswarm.protocol.net import SwarmNet, start_net
from pathswarm.protocol.path_choice import choose_path
from pathswarm.protocol.records import (
    ModuleAnnouncement,
    NodeMetrics,
    PathClaim,
    claims_key,
    max_record_ttl_s,
    module_key,
    record_to_wire,
    served_key,
    servers_key,
)
from pathswarm.protocol.spec import SwarmSpec

pytestmark = pytest.mark.timeout(60)

SPEC = SwarmSpec(name="dht-test", levels=(2, 2))
KEY = claims_key(SPEC.swarm_id)
# What start_net passes to p2pd, for the raw hivemind peer that plays the attacker.
LOOPBACK_ONLY = dict(host_maddrs=["/ip4/127.0.0.1/tcp/0"], use_relay=False, use_auto_relay=False,
                     auto_nat=False, nat_port_map=False, use_ipfs=False)


@pytest.fixture(scope="module")
def peers():
    started = []
    try:
        started.append(start_net(spec=SPEC))
        for _ in range(2):
            started.append(start_net(started[0].visible_maddrs(), spec=SPEC))
        yield started
    finally:
        for peer in reversed(started):
            peer.shutdown()


def wait_for(condition, timeout_s=10.0):
    """Poll until condition() is truthy (DHT expiry has no event to wait on)."""
    deadline = time.monotonic() + timeout_s
    while not (result := condition()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)
    return result


def new_claim(peer, path, tokens_per_s=100.0):
    return PathClaim(path=path, peer_id=peer.peer_id, tokens_per_s=tokens_per_s, round=0, expires_at=0.0)


def test_peers_listen_on_loopback_and_peer_ids_are_the_owner_keys(peers):
    for peer in peers:
        assert peer.visible_maddrs()
        assert all(m.startswith("/ip4/127.0.0.1/tcp/") for m in peer.visible_maddrs())
        assert peer_id_of_owner(peer.owner) == peer.peer_id
    assert len({p.peer_id for p in peers}) == len({p.owner for p in peers}) == 3


def test_a_claim_published_by_one_peer_is_read_by_the_others(peers):
    a, b, c = peers
    stored = publish_claim(a, SPEC, new_claim(a, (0, 1)), ttl_s=20)
    try:
        assert stored is not None and stored.expires_at > get_dht_time()
        assert read_claims(b, SPEC) == [stored]
        assert read_claims(c, SPEC) == [stored]
        # c sees (0, 1) served and picks another path; a (its own claim ignored) is free to pick any.
        assert choose_path(SPEC, read_claims(c, SPEC), 0.0, c.peer_id, get_dht_time()) != (0, 1)
    finally:
        assert withdraw_claim(a, SPEC, stored)
    assert read_claims(b, SPEC) == []  # the tombstone is read as no claim


def test_nobody_can_overwrite_or_withdraw_another_peers_claim(peers):
    a, b, c = peers
    stored = publish_claim(a, SPEC, new_claim(a, (1, 0)), ttl_s=20)
    try:
        forged = stored.model_copy(update={"path": (1, 1), "tokens_per_s": 0.0, "expires_at": stored.expires_at + 5})
        # b writes under a's subkey: its validator cannot sign for a's key, every peer refuses it.
        assert not b.dht.store(KEY, record_to_wire(forged), forged.expires_at, subkey=a.owner)
        with pytest.raises(ValueError, match="names peer"):
            withdraw_claim(b, SPEC, stored)  # the seam refuses before the DHT would
        assert read_claims(c, SPEC) == read_claims(a, SPEC) == [stored]
    finally:
        withdraw_claim(a, SPEC, stored)


def test_a_peer_without_the_swarm_validator_cannot_forge_claims(peers):
    a, b, c = peers
    stored = publish_claim(a, SPEC, new_claim(a, (0, 0)), ttl_s=20)
    rogue_key = RSAPrivateKey()
    rogue_validator = RSASignatureValidator(rogue_key)
    rogue = hivemind.DHT(initial_peers=a.visible_maddrs(), start=True, record_validators=[rogue_validator],
                         **LOOPBACK_ONLY)
    try:
        expiration = get_dht_time() + 20
        forged = record_to_wire(stored.model_copy(update={"path": (1, 1), "expires_at": expiration + 5}))
        rogue.store(KEY, forged, expiration + 5, subkey=a.owner)  # unsigned, under a's subkey
        rogue.store(KEY, {"path": [9, 9], "junk": "x" * 3000}, expiration, subkey=b"rogue")  # no owner
        # Signed by the rogue's own key, but in a's name: refused by the peer id binding.
        rogue.store(KEY, forged, expiration, subkey=rogue_validator.local_public_key)
        assert rogue.get(KEY, latest=True) is not None  # the rogue does hold its forgeries
        for reader in (a, b, c):
            assert read_claims(reader, SPEC) == [stored]
            # Not only filtered on read: the honest peers' validators refused every forgery.
            assert set(reader.dht.get(KEY, latest=True).value) == {a.owner}
        assert rogue.is_alive() and all(p.dht.is_alive() for p in peers)
    finally:
        rogue.shutdown()
        withdraw_claim(a, SPEC, stored)


def test_swarm_record_validator_without_a_network():
    key = RSAPrivateKey()
    owner = RSASignatureValidator(key).local_public_key
    validator = CompositeValidator([RSASignatureValidator(key), SwarmRecordValidator(SPEC)])
    claim = PathClaim(path=(0, 1), peer_id=peer_id_of_owner(owner), tokens_per_s=1.0, round=0, expires_at=5.0)

    def record(value, subkey=owner, key=KEY, expires=10.0):
        raw = DHTRecord(DHTID.generate(source=key).to_bytes(), MSGPackSerializer.dumps(subkey),
                        MSGPackSerializer.dumps(value), expires)
        return dataclasses.replace(raw, value=validator.sign_value(raw))

    assert validator.validate(record(record_to_wire(claim)))
    in_other_name = claim.model_copy(update={"peer_id": "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"})
    assert not validator.validate(record(record_to_wire(in_other_name)))
    assert not validator.validate(record(record_to_wire(claim), subkey=b"no owner"))
    assert not validator.validate(record({**record_to_wire(claim), "path": [0, 2]}))  # off the spec
    assert not validator.validate(record(b"\x00" * 5000))
    assert not validator.validate(record(record_to_wire(claim), key=module_key(SPEC.swarm_id, "L0M0")))
    # DHT hygiene (docs/SECURITY.md, "DHT writer"): nothing outside the swarm, nothing that outlives its use
    assert not validator.validate(record(b"anything", key="not-our-key"))
    assert not validator.validate(record(b"anything", subkey=b"x", key="not-our-key"))
    longest = max_record_ttl_s(SPEC)
    assert validator.validate(record(record_to_wire(claim), expires=get_dht_time() + longest - 5))
    assert not validator.validate(record(record_to_wire(claim), expires=get_dht_time() + longest + 5))
    assert not validator.validate(record(record_to_wire(claim), expires=1e11))  # the year 5138
    me, stranger = peer_id_of_owner(owner), "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
    served = {"swarm_id": "0" * 64, "name": "x"}
    assert validator.validate(record(served, key=served_key(me)))
    assert not validator.validate(record(served, key=served_key(stranger)))  # another peer's served swarm
    assert not validator.validate(record(served, subkey=b"x", key=served_key(me)))  # unsigned
    assert not validator.validate(record("not a dict", key=served_key(me)))
    assert validator.validate(record(me, key=servers_key(SPEC.swarm_id)))
    assert not validator.validate(record(stranger, key=servers_key(SPEC.swarm_id)))  # must name its signer
    assert not validator.validate(record(me, key=servers_key("1" * 64)))  # another swarm's


def test_the_validators_check_a_record_once_and_a_changed_one_again(monkeypatch):
    """Each DHT read meets the same signed records again (every responder's copy, every round's claims): checked
    once (one RSA verify, one parse); a record whose bytes differ in anything is checked again, and refused ones are
    never remembered."""
    from hivemind.utils.crypto import RSAPublicKey

    from pathswarm.protocol.net import validator as validator_module
    from pathswarm.protocol.net.validator import CachedSignatureValidator, Passed

    verified, parsed = [], []
    real_verify, real_parse = RSAPublicKey.verify, validator_module.parse_record
    monkeypatch.setattr(RSAPublicKey, "verify", lambda self, *a: verified.append(1) or real_verify(self, *a))
    monkeypatch.setattr(validator_module, "parse_record", lambda *a: parsed.append(1) or real_parse(*a))
    key = RSAPrivateKey()
    signer = CachedSignatureValidator(key)
    validator = CompositeValidator([signer, SwarmRecordValidator(SPEC)])
    owner = signer.local_public_key
    claim = PathClaim(path=(0, 1), peer_id=peer_id_of_owner(owner), tokens_per_s=1.0, round=0, expires_at=5.0)

    def record(value, expires=10.0):
        raw = DHTRecord(DHTID.generate(source=KEY).to_bytes(), MSGPackSerializer.dumps(owner),
                        MSGPackSerializer.dumps(value), expires)
        return dataclasses.replace(raw, value=validator.sign_value(raw))

    good = record(record_to_wire(claim))
    assert all(validator.validate(good) for _ in range(5))
    assert len(verified) == 1 and len(parsed) == 1
    # the same signature on other bytes: refused, whatever passed before
    other = record_to_wire(claim.model_copy(update={"round": 7}))
    signature = signer.SIGNATURE_FORMAT.replace(b"_value_", signer._SIGNATURE_RE.findall(good.value)[0])
    forged = dataclasses.replace(good, value=MSGPackSerializer.dumps(other) + signature)
    assert not validator.validate(forged) and not validator.validate(forged)
    assert len(verified) == 3  # refused twice, checked twice
    assert not validator.validate(dataclasses.replace(good, expiration_time=11.0))  # the signature covers expiry
    renewed = record(record_to_wire(claim.model_copy(update={"round": 1})))
    assert validator.validate(renewed) and len(parsed) == 2
    kept = Passed(size=2)
    for digest in (b"a", b"b", b"c"):
        kept.add(digest)
    assert b"a" not in kept and b"b" in kept and b"c" in kept


def test_bad_records_read_are_dropped_with_one_log_line_each(caplog):
    # What a peer's DHT process let through is checked again on read (defence in depth).
    owner = RSASignatureValidator(RSAPrivateKey()).local_public_key
    me = peer_id_of_owner(owner)
    good = PathClaim(path=(1, 0), peer_id=me, tokens_per_s=2.0, round=1, expires_at=get_dht_time() + 60)
    wire = record_to_wire(good)
    other = RSASignatureValidator(RSAPrivateKey()).local_public_key
    found = {
        owner: wire,
        other: wire,  # signed by another key, in my name
        b"plain": wire,  # no owner key
        "text": wire,
        other + b"x": {**wire, "path": [5, 5]},
        other + b"y": [1, 2, 3],
    }

    def fake(value):
        dht = types.SimpleNamespace(get=lambda key, latest: ValueWithExpiration(value, get_dht_time() + 60))
        return SwarmNet(dht, owner=b"", peer_id="")  # the seam around a DHT that answers `value`

    caplog.set_level(logging.INFO, logger="pathswarm.protocol.dht")
    items = {k: ValueWithExpiration(v, get_dht_time() + 60) for k, v in found.items()}
    assert read_claims(fake(items), SPEC) == [good]
    assert len([r for r in caplog.records if r.message.startswith("dropped a PathClaim")]) == 5
    assert read_claims(fake(b"a regular value, not a dictionary"), SPEC) == []


def test_expired_claims_disappear(peers):
    a, b, c = peers  # only this test publishes from c: a tombstone of c would outlive a short claim
    stored = publish_claim(c, SPEC, new_claim(c, (1, 1), tokens_per_s=0.0), ttl_s=1.0)
    assert stored is not None
    assert read_claims(a, SPEC) == [stored]
    wait_for(lambda: read_claims(a, SPEC) == [], timeout_s=10)

    def gone_from_the_dht():
        found = b.dht.get(KEY, latest=True)
        return found is None or c.owner not in found.value

    wait_for(gone_from_the_dht, timeout_s=10)  # hivemind dropped the record, not just our filter


def test_module_announcements_and_metrics_round_trip(peers):
    a, b, c = peers
    announcement = ModuleAnnouncement(module_id="L0M1", round=3, digest="0f" * 32, peer_id=b.peer_id, numel=4096)
    assert announce_module(b, SPEC, announcement, ttl_s=20)
    assert read_module_holders(c, SPEC, "L0M1") == [announcement]
    assert read_module_holders(c, SPEC, "L0M0") == []
    with pytest.raises(ValueError, match="not in the swarm"):
        announce_module(b, SPEC, announcement.model_copy(update={"module_id": "L1M7"}), ttl_s=20)

    metrics = NodeMetrics(path=(0, 1), peer_id=b.peer_id, round=3, loss=2.25, tokens_per_s=1500.0,
                          bytes_sent=1 << 20, bytes_received=1 << 21)
    assert publish_metrics(b, SPEC, metrics, ttl_s=20)
    assert read_metrics(a, SPEC) == [metrics]


def test_records_stored_in_one_search_are_each_read_back(peers):
    """A node's round of records (its modules' announcements, its metrics) goes out in one store and our modules'
    announcements come back in one read: each record lands under its own key, and the batched read gives what a
    read of each key gives."""
    a, b, c = peers
    anns = [ModuleAnnouncement(module_id=mid, round=7, digest=f"{i:02x}" * 32, peer_id=a.peer_id, numel=64)
            for i, mid in enumerate(["L0M0", "L1M1"])]
    metrics = NodeMetrics(path=(0, 1), peer_id=a.peer_id, round=7, loss=1.5, tokens_per_s=10.0,
                          bytes_sent=1, bytes_received=2)
    entries = [announcement_entry(a, SPEC, ann, 20) for ann in anns] + [metrics_entry(a, SPEC, metrics, 20)]
    assert publish_entries(a, entries) == [True, True, True]
    both = read_modules_holders(c, SPEC, ["L0M0", "L1M1", "L1M0"])
    assert both == {"L0M0": [anns[0]], "L1M1": [anns[1]], "L1M0": []}
    assert [read_module_holders(b, SPEC, mid) for mid in ("L0M0", "L1M1")] == [[anns[0]], [anns[1]]]
    assert metrics in read_metrics(b, SPEC)
    with pytest.raises(ValueError, match="names peer"):  # a record in another peer's name is not sent at all
        announcement_entry(b, SPEC, anns[0], 20)


def _running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (a container's init may never reap an orphan)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads process trees from Linux's /proc")
def test_a_killed_node_takes_its_dht_process_and_p2pd_with_it():
    """SIGKILL gives the node no chance to shut its DHT down: the DHT process must notice by itself."""
    code = ("import time\n"
            "from pathswarm.protocol.net import start_net\n"
            "d = start_net()\n"
            "print(d.dht.pid, flush=True)\n"
            "time.sleep(60)\n")
    node = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        dht_pid = int(node.stdout.readline())
        with open(f"/proc/{dht_pid}/task/{dht_pid}/children") as f:
            daemons = [int(p) for p in f.read().split()]
        assert daemons and all("p2pd" in open(f"/proc/{p}/cmdline").read() for p in daemons)
        node.kill()
        node.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(map(_running, [dht_pid, *daemons])):
            time.sleep(0.1)
        assert not any(map(_running, [dht_pid, *daemons])), "the DHT process or p2pd outlived its node"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, signal.SIGKILL)


def test_a_peer_restarted_with_its_identity_keeps_its_dht_node_id_and_stores_to_it_succeed(peers, tmp_path):
    """hivemind drew a random DHT node id per start: the others kept the first run's id beside the second's, both
    naming the same peer, so a store reached the restarted peer twice, the copy was refused as not newer, and
    hivemind reported the store failed (about half of every store near it, measured: the "no peer accepted it"
    warnings of benchmarks/restarts.py)."""
    boot, b, _ = peers
    identity = str(tmp_path / "a.key")

    def node_id(net):
        return net.dht.run_coroutine(_node_id)

    first = start_net(boot.visible_maddrs(), spec=SPEC, identity_path=identity)
    try:
        first_id = node_id(first)
        assert publish_claim(first, SPEC, new_claim(first, (1, 0)), ttl_s=5) is not None
        assert publish_claim(b, SPEC, new_claim(b, (0, 1)), ttl_s=5) is not None  # b's routing table holds it now
    finally:
        first.shutdown()
    second = start_net(boot.visible_maddrs(), spec=SPEC, identity_path=identity)
    try:
        assert second.peer_id == first.peer_id and node_id(second) == first_id
        stored = [publish_claim(b, SPEC, new_claim(b, (0, 1)), ttl_s=5) is not None for _ in range(10)]
        assert all(stored), stored
    finally:
        second.shutdown()


async def _node_id(_dht, node):
    return node.node_id


def test_records_at_rounds_later_than_the_swarms_age_allows_are_dropped(caplog):
    from pathswarm.protocol.spec import CREATED_SLACK_S, MAX_ROUNDS_PER_S

    spec = SPEC.replace(created=int(get_dht_time()) - 100)  # a swarm 100 s old: rounds up to (100 + slack) × 20
    limit = spec.round_limit(get_dht_time())
    assert int((100 + CREATED_SLACK_S) * MAX_ROUNDS_PER_S) <= limit <= int((110 + CREATED_SLACK_S) * MAX_ROUNDS_PER_S)
    keys = [RSASignatureValidator(RSAPrivateKey()).local_public_key for _ in range(3)]
    found = {}
    for key, round_ in zip(keys, (5, limit - 100, 1 << 61), strict=True):
        found[key] = ValueWithExpiration(record_to_wire(ModuleAnnouncement(
            module_id="shared", round=round_, digest="0f" * 32, peer_id=peer_id_of_owner(key), numel=10)),
            get_dht_time() + 60)
    dht = types.SimpleNamespace(get=lambda key, latest: ValueWithExpiration(found, get_dht_time() + 60))
    net = SwarmNet(dht, owner=b"", peer_id="")  # the seam around a DHT that answers `found`
    caplog.set_level(logging.INFO, logger="pathswarm.protocol.dht")
    assert sorted(a.round for a in read_module_holders(net, spec, "shared")) == [5, limit - 100]
    assert any("later than the swarm's age allows" in r.message for r in caplog.records)
    # A spec that does not say when it was created bounds nothing (beyond the records' int64 range).
    assert sorted(a.round for a in read_module_holders(net, SPEC, "shared")) == [5, limit - 100, 1 << 61]
    # A node's metrics name rounds in their loss history and group sizes too: one too late there drops the record.
    metrics = {key: ValueWithExpiration(record_to_wire(NodeMetrics(
        path=(0, 0), peer_id=peer_id_of_owner(key), round=5, loss=2.0, tokens_per_s=1.0, bytes_sent=1,
        bytes_received=1, history=((4, 2.0), (late, 1.0)),
        groups=(("shared", 4, 2),))), get_dht_time() + 60) for key, late in zip(keys[:2], (5, 1 << 61), strict=True)}
    dht.get = lambda key, latest: ValueWithExpiration(metrics, get_dht_time() + 60)
    assert [m.peer_id for m in read_metrics(net, spec)] == [peer_id_of_owner(keys[0])]
