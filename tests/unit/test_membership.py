"""Membership certificates (protocol/membership.py): signed by the owner, bound to one peer id and one
swarm, expiring; anything else is a MembershipError saying why. Pure code, no network."""

import base64
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pathswarm.protocol.membership import (
    CLOCK_SKEW_S,
    Ed25519PrivateKey,
    Gate,
    MembershipError,
    issue,
    load_owner_key,
    parse,
    parse_expiry,
    public_key_text,
    save_owner_key,
    verify,
)
from pathswarm.protocol.spec import MembershipSpec, SpecError, SwarmSpec

OWNER = Ed25519PrivateKey.generate()
OWNER_KEY = public_key_text(OWNER)
SWARM = "ab" * 32
PEER = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
OTHER_PEER = "QmQycYEeJ8hLdKTpsCAAputNjZYvdZWANTaRF9kNuXrBpe"
NOW = 1_800_000_000.0


def cert(peer=PEER, swarm=SWARM, owner=OWNER, expires=NOW + 3600):
    return issue(owner, swarm, peer, expires, now=NOW).token


def check(token, peer=PEER, swarm=SWARM, now=NOW + 10):
    return verify(token, owner_key=OWNER_KEY, swarm_id=swarm, peer_id=peer, now=now)


def test_a_certificate_admits_its_peer_to_its_swarm_until_it_expires():
    m = check(cert())
    assert (m.swarm_id, m.peer_id, m.expires_at, m.issued_at) == (SWARM, PEER, NOW + 3600, NOW)
    assert len(m.token) < 400
    check(cert(), now=NOW + 3600 + CLOCK_SKEW_S - 1)  # clocks behind by a few minutes are tolerated
    with pytest.raises(MembershipError, match="expired"):
        check(cert(), now=NOW + 3600 + CLOCK_SKEW_S + 1)


def test_replay_by_another_peer_id_is_refused():
    with pytest.raises(MembershipError, match=f"certificate is for peer {PEER}, presented by {OTHER_PEER}"):
        check(cert(), peer=OTHER_PEER)


def test_another_swarm_or_another_owner_is_refused():
    with pytest.raises(MembershipError, match="for swarm"):
        check(cert(swarm="cd" * 32))
    with pytest.raises(MembershipError, match="not signed by this swarm's owner"):
        check(cert(owner=Ed25519PrivateKey.generate()))


def test_editing_the_payload_breaks_the_signature():
    prefix, payload, sig = cert().split(".")
    body = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    for field, value in (("peer", OTHER_PEER), ("exp", int(NOW) + 10**8), ("swarm", "cd" * 32)):
        forged_payload = base64.urlsafe_b64encode(json.dumps({**body, field: value}).encode()).decode().rstrip("=")
        with pytest.raises(MembershipError, match="not signed by this swarm's owner"):
            check(f"{prefix}.{forged_payload}.{sig}", peer=value if field == "peer" else PEER,
                  swarm=value if field == "swarm" else SWARM)


@pytest.mark.parametrize("token, reason", [
    (None, "no membership certificate"), ("", "no membership certificate"), ("hello", "not a pathswarm"),
    ("psm1.!!.AA", "not base64url"), ("psm1.AAAA.AAAA", "not JSON"), ("x" * 5000, "exceeds"),
    (b"\xff\xfe", "not ASCII"),
])
def test_malformed_certificates_say_what_is_wrong(token, reason):
    with pytest.raises(MembershipError, match=reason):
        check(token)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=600), st.text(max_size=600),
                 st.builds(lambda i, b: cert()[:i] + b + cert()[i + 1:], st.integers(0, 300),
                           st.sampled_from("A_-.=0z"))))
def test_any_input_gives_a_membership_error_or_a_valid_certificate(token):
    try:
        m = check(token)
    except MembershipError:
        return
    assert m.peer_id == PEER and m.swarm_id == SWARM  # only an unchanged (or equivalent) token passes


def test_gate_open_swarm_admits_everyone_private_swarm_checks_and_caches():
    assert Gate("", SWARM).check(None, PEER) is None
    gate = Gate(OWNER_KEY, SWARM)
    token = cert(expires=NOW + 10**9)
    gate.check(token, PEER)
    gate.check(token, PEER)  # cached
    with pytest.raises(MembershipError):
        gate.check(token, OTHER_PEER)  # the cache is keyed by the peer id too
    with pytest.raises(MembershipError):
        gate.check(None, PEER)


def test_expiry_option():
    assert parse_expiry("30d", now=NOW) == NOW + 30 * 86400
    assert parse_expiry("12h", now=NOW) == NOW + 12 * 3600
    assert parse_expiry("2027-01-31") == 1801353600.0  # midnight UTC
    with pytest.raises(MembershipError, match="--expires takes"):
        parse_expiry("soon")
    with pytest.raises(MembershipError, match="expire before"):
        issue(OWNER, SWARM, PEER, NOW - 1, now=NOW)
    with pytest.raises(MembershipError, match="peer id"):
        issue(OWNER, SWARM, "not a peer id!", NOW + 10, now=NOW)


def test_owner_key_file_is_private_and_never_overwritten(tmp_path):
    path = tmp_path / "owners" / "k.key"
    save_owner_key(OWNER, path)
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert public_key_text(load_owner_key(path)) == OWNER_KEY
    with pytest.raises(MembershipError, match="never overwritten"):
        save_owner_key(Ed25519PrivateKey.generate(), path)
    os.chmod(path, 0o644)
    with pytest.raises(MembershipError, match="readable by other users"):
        load_owner_key(path)
    (tmp_path / "junk.key").write_bytes(b"junk")
    os.chmod(tmp_path / "junk.key", 0o600)
    with pytest.raises(MembershipError, match="not a PEM private key"):
        load_owner_key(tmp_path / "junk.key")


def test_the_owner_key_is_part_of_the_swarm_id():
    open_spec = SwarmSpec(name="m")
    private = open_spec.replace(membership=MembershipSpec(owner_key=OWNER_KEY))
    assert private.swarm_id != open_spec.swarm_id and private.membership.private and not open_spec.membership.private
    with pytest.raises(SpecError, match="membership.owner_key"):
        SwarmSpec(membership=MembershipSpec(owner_key="rsa:abc"))


def test_parse_reads_without_verifying():
    m, payload, sig = parse(cert())
    assert m.peer_id == PEER and len(sig) == 64 and b'"peer"' in payload


def test_the_owners_revocation_list_shuts_a_member_out_of_every_gate_that_learns_it():
    from pathswarm.protocol.membership import MAX_REVOKED, sign_revocations, verify_revocations

    gate = Gate(OWNER_KEY, SWARM)
    token = cert(expires=NOW + 10**9)
    gate.check(token, PEER)  # a member, cached
    first = sign_revocations(OWNER, SWARM, {PEER}, now=NOW)
    assert verify_revocations(first.token, owner_key=OWNER_KEY, swarm_id=SWARM).peers == {PEER}
    assert gate.learn(first.token)
    with pytest.raises(MembershipError, match="revoked"):
        gate.check(token, PEER)  # its valid certificate, even cached, no longer admits it
    gate.check(cert(peer=OTHER_PEER, expires=NOW + 10**9), OTHER_PEER)  # others still pass
    # Lists are cumulative and the newest wins: an older one (a replay) changes nothing, a newer one replaces it.
    assert not gate.learn(sign_revocations(OWNER, SWARM, set(), now=NOW - 60).token)
    assert gate.revocations.peers == {PEER}
    assert gate.learn(sign_revocations(OWNER, SWARM, {OTHER_PEER}, now=NOW + 60).token)
    gate.check(token, PEER)
    # Only the owner revokes, only for its swarm; an open swarm has nobody to revoke.
    stranger = Ed25519PrivateKey.generate()
    for bad, why in ((sign_revocations(stranger, SWARM, {OTHER_PEER}, now=NOW + 120).token, "not signed"),
                     (sign_revocations(OWNER, "cd" * 32, {OTHER_PEER}, now=NOW + 120).token, "another swarm"),
                     ("psr1.e30.AAAA", "not signed"), ("psm1.x.y", "not a revocation list")):
        with pytest.raises(MembershipError, match=why):
            gate.learn(bad)
    assert not Gate("", SWARM).learn(first.token)
    with pytest.raises(MembershipError, match="at most"):
        sign_revocations(OWNER, SWARM, {f"Qm{i:044d}" for i in range(MAX_REVOKED + 1)})


def test_an_owner_key_can_be_encrypted_with_a_passphrase(tmp_path):
    from pathswarm.protocol.membership import PassphraseNeeded, owner_key_encrypted

    key = Ed25519PrivateKey.generate()
    path = tmp_path / "owner.key"
    save_owner_key(key, path, "correct horse")
    assert owner_key_encrypted(path) and b"ENCRYPTED PRIVATE KEY" in path.read_bytes()
    raw = key.private_bytes_raw()
    assert raw not in path.read_bytes()
    with pytest.raises(PassphraseNeeded, match="is encrypted"):
        load_owner_key(path)
    with pytest.raises(PassphraseNeeded, match="wrong passphrase"):
        load_owner_key(path, "battery staple")
    assert load_owner_key(path, "correct horse").private_bytes_raw() == raw
    plain = tmp_path / "plain.key"
    save_owner_key(key, plain)
    assert not owner_key_encrypted(plain) and load_owner_key(plain, "ignored").private_bytes_raw() == raw


def test_the_cli_encrypts_the_owner_key_and_asks_for_its_passphrase(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from pathswarm.node.app.cli import main

    monkeypatch.setenv("PATHSWARM_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PATHSWARM_OWNER_PASSPHRASE", raising=False)
    spec_path, key_path = tmp_path / "swarm.toml", tmp_path / "owner.key"
    runner = CliRunner()
    res = runner.invoke(main, ["swarm", "init", "-o", str(spec_path), "--corpus", "synthetic", "--width", "32",
                               "--base-width", "32", "--heads", "2", "--layers-per-module", "1", "--context-len", "32",
                               "--private", "--owner-key", str(key_path), "--passphrase"], input="s3cret\ns3cret\n")
    assert res.exit_code == 0, res.output
    assert b"ENCRYPTED PRIVATE KEY" in key_path.read_bytes()
    invite = ["swarm", "invite", "--swarm", str(spec_path), "--peer-id", PEER, "--owner-key", str(key_path)]
    res = runner.invoke(main, invite, input="s3cret\n")
    assert res.exit_code == 0 and "psm1." in res.output, res.output
    res = runner.invoke(main, invite, input="wrong\n")
    assert res.exit_code == 2 and "wrong passphrase" in res.output, res.output
    monkeypatch.setenv("PATHSWARM_OWNER_PASSPHRASE", "s3cret")  # for scripts: no prompt
    revoke = ["swarm", "revoke", "--swarm", str(spec_path), "--peer-id", PEER, "--owner-key", str(key_path)]
    res = runner.invoke(main, revoke)
    assert res.exit_code == 0 and "1 peer(s) revoked" in res.output, res.output
    listed = (tmp_path / "owner.key.revoked").read_text()
    res = runner.invoke(main, [*revoke[:-4], "--peer-id", OTHER_PEER, "--owner-key", str(key_path)])
    assert res.exit_code == 0 and "2 peer(s) revoked" in res.output, res.output  # cumulative
    assert (tmp_path / "owner.key.revoked").read_text() != listed


def test_a_full_revocation_list_fits_a_dht_record_with_the_relayers_certificate():
    import msgpack

    from pathswarm.protocol.membership import MAX_REVOKED, sign_revocations
    from pathswarm.protocol.records import MAX_RECORD_BYTES, RevocationRecord, record_to_wire

    peers = {"Qm" + f"{i:02d}" * 22 for i in range(MAX_REVOKED)}  # 46 characters, as real peer ids
    revs = sign_revocations(OWNER, SWARM, peers, now=NOW)
    relayer = cert(expires=NOW + 10**9)
    record = RevocationRecord(peer_id=PEER, token=revs.token, membership=relayer)
    assert len(msgpack.packb(record_to_wire(record))) <= MAX_RECORD_BYTES


def test_the_dht_validators_check_gives_the_same_answer_whenever_it_is_asked():
    """hivemind drops a storer's whole dictionary when one entry fails validation: a record stored while its
    certificate was valid (or its writer not revoked) must not fail later. The validator's check (`valid_until`,
    the record's expiration) asks that the certificate covers the record's life, and leaves revocations to readers."""
    from pathswarm.protocol.membership import sign_revocations

    gate = Gate(OWNER_KEY, SWARM)
    token = cert(expires=NOW + 3600)
    gate.check(token, PEER, valid_until=NOW + 600)  # a record living 10 minutes of the certificate's hour
    with pytest.raises(MembershipError, match="expires before the record"):
        gate.check(token, PEER, valid_until=NOW + 3600 + CLOCK_SKEW_S + 1)
    gate.learn(sign_revocations(OWNER, SWARM, {PEER}, now=NOW).token)
    gate.check(token, PEER, valid_until=NOW + 600)  # still valid as stored: readers drop it, record by record
    with pytest.raises(MembershipError, match="revoked"):
        gate.check(token, PEER, now=NOW + 10)
    gate.check(token, PEER, valid_until=NOW + 600)  # and the answer does not depend on when it is asked
    with pytest.raises(MembershipError, match="not signed"):
        gate.check(cert(owner=Ed25519PrivateKey.generate()), PEER, valid_until=NOW)
