"""Hostile peers against real nodes on 127.0.0.1 (docs/SECURITY.md): each attack fails, honest replicas agree and
learn as well as in a clean run of the same swarm (validation loss within its run-to-run spread).

The hostile behaviour lives in separate processes that speak the protocol: tests/hostile_peer.py (forged state,
claimed later rounds) and tests/hostile_dht.py (DHT records honest peers must refuse).
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pathswarm.node.app.local_swarm import LocalSwarm
from pathswarm.node.app.replicas import replica_mismatches
from pathswarm.protocol.dht import peer_id_of_owner
from pathswarm.protocol.identity import ensure_identity, peer_id_of_identity
from pathswarm.protocol.net import start_net
from pathswarm.protocol.spec import AveragingSpec, InnerOptSpec, load_spec

from ..conftest import tiny_spec

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]
PATHS = {"a": "0.0", "b": "0.1"}  # both hold `shared` and L0M0
ROUNDS = 10
JOINER = {"name": "c", "path": "0.0", "rounds": 3}  # joins a's path: holds every module a holds, `shared` with b
# Honest training loss over the last rounds may end at most this much above the clean run's, node by node. Every arm
# has the same joiner, started once node a has trained a round. It joins a trained path: a joiner on path 1.0 brings
# an untrained L0M1, and its outer gradients of `shared` and L1M0, made through that random module, cost a up to 0.7
# of loss in 10 rounds, by chance, even with the same joiner in the clean arm (a ended at 2.29-2.94 against a clean
# 2.23-2.29 in five runs). Over benchmarks/hostile.py's 30 rounds, on a held-out set, a's final loss with that
# joiner spreads 1.70-1.76 between runs, and weighing the joiner's first rounds as 1 token did not improve it.
# Clean runs spread by about 10 % from network timing alone (where the overlapped outer step lands in the next
# round's inner steps), more under the full suite's load. A forged state (anchor 1e3) ends far above; the 2 % goal
# is measured over longer, repeated runs by benchmarks/hostile.py (every arm within it).
LOSS_TOLERANCE = 0.25
# Every node audits every round it did not reduce (1 in 8 otherwise, in a group of 2 or 3): a lying reducer is
# caught in the round it lies, and every arm pays the same audits.
NODE_ARGS = ["--max-tokens-per-s", "1280", "--audit-rate", "8"]


def hostile_spec():
    return tiny_spec().replace(inner=InnerOptSpec(steps=10, batch_size=4, warmup_steps=2),
                               averaging=AveragingSpec(grace_s=3.0, timeout_s=10.0, claim_ttl_s=8.0))


def start_swarm(tmp_path, extra: dict[str, list[str]] | None = None,
                entry: dict[str, list[str]] | None = None) -> tuple[LocalSwarm, str]:
    spec_path = tmp_path / "swarm.toml"
    spec_path.write_text(hostile_spec().to_toml())
    swarm = LocalSwarm(spec_path, tmp_path / "swarm")
    swarm.start_bootstrap()
    for i, (name, path) in enumerate(PATHS.items()):
        swarm.start_node(name, path=path, max_rounds=ROUNDS, seed=i,
                         extra=[*NODE_ARGS, "--wait-peers", "2", *(extra or {}).get(name, [])],
                         entry=(entry or {}).get(name))
    return swarm, str(spec_path)


def wait_first_round(swarm: LocalSwarm, name: str = "a", timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (swarm.status(name) or {}).get("round", 0) < 1:
        assert time.monotonic() < deadline and name in swarm.running(), swarm.tail(name, 10)
        time.sleep(0.2)


def start_joiner(swarm: LocalSwarm) -> dict:
    """Start the joiner (every arm has it, at the same point: node a has trained a round); its ready file."""
    swarm.start_node(JOINER["name"], path=JOINER["path"], max_rounds=JOINER["rounds"], seed=2, extra=NODE_ARGS)
    return swarm.wait_ready(JOINER["name"])


def spawn_hostile(module: str, args: list[str], errors: Path, ready: str) -> subprocess.Popen:
    """Start `python -m MODULE ARGS` (a hostile process of tests/) and wait for its `ready` line on stdout."""
    with open(errors, "w") as err:  # a file, not a pipe: nothing blocks the hostile process while we wait
        proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=err,
                                text=True)
    try:
        assert proc.stdout.readline().strip() == ready, errors.read_text()[-3000:]
    except BaseException:
        proc.kill()
        raise
    return proc


def finish(swarm: LocalSwarm) -> dict[str, dict]:
    """Wait for the nodes' last round; their final status files, checked for agreeing replicas."""
    codes = swarm.wait_nodes(list(PATHS), timeout_s=150)
    assert codes == dict.fromkeys(PATHS, 0), [swarm.tail(n, 10) for n in PATHS]
    assert swarm.wait_nodes([JOINER["name"]], timeout_s=120) == {JOINER["name"]: 0}, swarm.tail(JOINER["name"], 10)
    st = {n: swarm.status(n) for n in PATHS}
    mismatches, compared = replica_mismatches(list(st.values()))
    assert not mismatches and compared >= 10, (mismatches, compared)
    return st


@pytest.fixture(scope="module")
def clean_loss(tmp_path_factory) -> dict[str, float]:
    """Each node's final validation loss in the same swarm, joiner included, with nobody hostile in it."""
    swarm, _ = start_swarm(tmp_path_factory.mktemp("clean"))
    try:
        wait_first_round(swarm)
        start_joiner(swarm)
        st = finish(swarm)
    finally:
        swarm.close()
    return {n: final_train_loss(s) for n, s in st.items()}


def final_train_loss(status: dict) -> float:
    """Mean training loss of the node's last 3 rounds (its status' loss history: 3 × 10 steps × 4 sequences of 32
    bytes). Compared with the clean run's instead of the final validation loss, which reads the 3 validation
    documents (1,024 bytes) of the node's path: in one suite run node a's went 2.16 → 2.40 → 3.14 over its last
    two rounds while its training loss fell 2.28 → 2.14 and its path neighbour ended at 2.19 (a ±30 % swing from
    the last outer steps on a tiny set, not an attack). A forged state or an applied lie moves the anchor that the
    next inner steps start from, so it shows in the training loss as well."""
    last = [loss for _, loss in status["loss_history"][-3:]]
    return sum(last) / len(last)


def assert_learned_as_clean(st: dict[str, dict], clean: dict[str, float]) -> None:
    for n, s in st.items():
        assert s["val_loss_after"] < s["val_loss_before"] - 0.5, (n, s)
        assert final_train_loss(s) <= (1 + LOSS_TOLERANCE) * clean[n], (n, final_train_loss(s), clean)


@pytest.mark.slow  # ~24 s: in `make test-slow` (CI runs it after the default suite, which was at 10:28 of 10 min)
def test_a_peer_claiming_a_later_round_cannot_replace_a_modules_state(tmp_path, clean_loss):
    """The hostile peer serves a forged `shared` 50 rounds ahead, announces it, and sends the victim contributions
    claiming that round; meanwhile a node joins (it used to take the newest announced state: the forged one)."""
    swarm, spec_path = start_swarm(tmp_path)
    try:
        report, errors = tmp_path / "hostile.json", tmp_path / "hostile.err"
        victim = str(swarm.node_files("a")["status.json"])
        hostile = spawn_hostile("tests.hostile_peer", [spec_path, swarm.maddr, victim, str(report), "12"], errors,
                                "announced")
        try:
            joined = start_joiner(swarm)
            assert hostile.wait(timeout=180) == 0, errors.read_text()[-3000:]
        finally:
            hostile.kill()
        st = finish(swarm)
        attack = json.loads(report.read_text())
        st_c = swarm.status("c")
        for s in [*st.values(), st_c]:
            assert attack["forged_digest"] not in s["history"].get("shared", {}).values()
            assert s["module_rounds"]["shared"] < attack["forged_round"]
        joiner_log = (tmp_path / "swarm" / "c.log").read_text()
        assert f"round {attack['forged_round']}" not in joiner_log and joined["peer_id"] == st_c["peer_id"]
        assert_learned_as_clean(st, clean_loss)
        # The attack was delivered: the victim read the claimed later round and answered "behind", the answer on which
        # it used to re-sync from the sender; it never took the forged round as its own (with the old rule it did,
        # then merged the hostile peer's next contributions "alone" at round 51: checked by reverting the rule).
        assert attack["answers"].get("behind", 0) >= 3 and set(attack["answers"]) <= {"behind", "failed"}, attack
        assert "not re-syncing" in (tmp_path / "swarm" / "a.log").read_text()
    finally:
        swarm.close()


@pytest.mark.slow  # ~36 s: in `make test-slow` (CI runs it too); the default suite was at 9:33 of 10 min
def test_a_stranger_can_neither_stuff_the_dht_nor_flood_a_node(tmp_path, clean_loss):
    """Two strangers at once (one swarm run for both: the suite's time). tests/hostile_dht.py writes, while the swarm
    trains, a key outside the swarm, a claim that would outlive every TTL, an oversized announcement and two
    forgeries of the bootstrap peer's served swarm, then leaves. A reader that checks signatures only then sees what
    honest peers stored: none of it (with the validator before SECURITY.md's DHT hygiene, the junk, the claim and the
    unsigned forgery were stored, and joiners refused the bootstrap peer as serving "another swarm").
    Meanwhile tests/hostile_flood.py floods node a for 12 s, 8 requests at a time: state downloads it never reads,
    contributions with junk frames, stance questions, audit-frame requests. The node refuses what is over its
    budgets (docs/SECURITY.md, "RPC caller") and trains on: no round waits past its grace window, replicas agree,
    loss as in the clean run."""
    swarm, spec_path = start_swarm(tmp_path)
    spec = load_spec(spec_path)
    try:
        wait_first_round(swarm)
        start_joiner(swarm)  # first, as in every arm: the flood's own CPU (same machine) would delay its start
        flood_report, flood_errors = tmp_path / "flood.json", tmp_path / "flood.err"
        victim = str(swarm.node_files("a")["status.json"])
        flood = spawn_hostile("tests.hostile_flood", [spec_path, swarm.maddr, victim, str(flood_report), "12"],
                              flood_errors, "flooding")
        try:
            report = tmp_path / "hostile-dht.json"
            hostile = subprocess.run([sys.executable, "-m", "tests.hostile_dht", spec_path, swarm.maddr, str(report)],
                                     cwd=ROOT, capture_output=True, text=True, timeout=120)
            assert hostile.returncode == 0, hostile.stderr[-3000:]
            assert flood.wait(timeout=120) == 0, flood_errors.read_text()[-3000:]
        finally:
            flood.kill()
        attack = json.loads(report.read_text())
        bootstrap = swarm.maddr.rsplit("/p2p/", 1)[1]
        reader = start_net([swarm.maddr])  # no swarm validator: it sees what the honest peers hold
        try:
            for name, a in attack["attacks"].items():
                found = reader.get(a["key"])
                owners = {peer_id_of_owner(k) if isinstance(k, bytes) else None: v
                          for k, v in (found.items() if isinstance(found, dict) else [])}
                assert attack["peer_id"] not in owners, (name, found)
                if name.startswith("served"):  # only the bootstrap peer's own, signed record stands
                    assert set(owners) == {bootstrap}, (name, found)
                else:
                    assert found is None or isinstance(found, dict), (name, found)
            assert reader.served_swarm(bootstrap)[0] == spec.swarm_id
        finally:
            reader.shutdown()
        joiner = start_net([swarm.maddr], spec=spec)  # raised WrongSwarmError when the forgery stood
        joiner.shutdown()
        st = finish(swarm)
        flooded = json.loads(flood_report.read_text())
        kinds = {"state", "contribute", "stance", "frames"}
        assert sum(flooded["sent"].values()) >= 100 and set(flooded["sent"]) == kinds, flooded
        # the budgets engaged: the flood was answered "rate limited" or "busy"
        assert sum(n for k, n in flooded["answers"].items() if "refused" in k) >= 20, flooded
        for n, s in st.items():
            assert s["wait_max_s"] <= hostile_spec().averaging.grace_s + 5, (n, s["wait_max_s"])
        assert_learned_as_clean(st, clean_loss)
    finally:
        swarm.close()


def identities_with_first(tmp_path, first: str, *others: str) -> dict[str, Path]:
    """Identity files for nodes, the first one's peer id sorting before the others' (ground: a few tries)."""
    keys = {n: tmp_path / "ids" / f"{n}.key" for n in (first, *others)}
    for other in others:
        ensure_identity(keys[other])
    while True:
        keys[first].unlink(missing_ok=True)
        ensure_identity(keys[first])
        if all(peer_id_of_identity(keys[first]) < peer_id_of_identity(keys[o]) for o in others):
            return keys


def test_a_reducer_that_lies_is_caught_by_an_audit_and_left_out(tmp_path, clean_loss):
    """Node a reduces (its peer id sorts first) and, in the rounds of `shared` that merge all three nodes (the
    joiner's), sends the group the sign-flipped mean of their contributions (tests/lying_node.py); it applies the
    same lie itself, so every digest agrees and only recomputing the mean from the frames the result lists can tell.
    The honest nodes audit the round, stop trusting a, and train on without it, their replicas equal."""
    keys = identities_with_first(tmp_path, "a", "b")
    swarm, _ = start_swarm(tmp_path, extra={n: ["--identity", str(k)] for n, k in keys.items()},
                           entry={"a": ["-m", "tests.lying_node", "3"]})
    try:
        wait_first_round(swarm)
        start_joiner(swarm)
        codes = swarm.wait_nodes(["a", "b", JOINER["name"]], timeout_s=150)
        assert codes["b"] == 0 and codes[JOINER["name"]] == 0, [swarm.tail(n, 10) for n in ("b", JOINER["name"])]
        liar = peer_id_of_identity(keys["a"])
        assert "LYING" in (tmp_path / "swarm" / "a.log").read_text(), swarm.tail("a", 20)  # the attack happened
        st = {n: swarm.status(n) for n in ("b", JOINER["name"])}
        for n, s in st.items():
            assert "not what its frames give" in s["distrusted"].get(liar, ""), (n, s["distrusted"], swarm.tail(n, 20))
            assert s["audits"] >= 1
            # its checks drew each frame from its own contributor, the reducer's only from it (frame_store.py)
            assert s["audits_gathered"] >= 1, (n, s["audits"], s["audits_gathered"])
        # b trained its last rounds of `shared` without the liar.
        groups = st["b"]["groups"]["shared"]
        with_liar = [int(r) for r, members in groups.items() if liar in members]
        assert with_liar and max(with_liar) <= max(map(int, groups)) - 3 and max(map(int, groups)) >= ROUNDS - 1, groups
        mismatches, compared = replica_mismatches(list(st.values()))
        assert not mismatches and compared >= 1, (mismatches, compared)
        # One sign-flipped round is paid for, then b learns as in the clean run.
        assert_learned_as_clean({"b": st["b"]}, clean_loss)
    finally:
        swarm.close()



@pytest.mark.slow  # ~30 s: with the slow ones (`make test-slow`, in CI after the default suite), which is near 10 min
def test_a_lie_checked_before_applying_is_reduced_again_by_the_next_candidate(tmp_path):
    """Three nodes start together on paths that share `shared` and L0M0; a (its peer id sorts first, so it reduces)
    lies in its very first round, which merges all three. A reducer's first rounds are checked before they are
    applied: b and c catch the lie, send the same contribution for the same round to the next candidate of the
    agreed list, and that round closes honestly between them: the lie costs a grace window, not a round."""
    keys = identities_with_first(tmp_path, "a", "b", "c")
    spec_path = tmp_path / "swarm.toml"
    spec_path.write_text(hostile_spec().to_toml())
    swarm = LocalSwarm(spec_path, tmp_path / "swarm")
    try:
        swarm.start_bootstrap()
        for i, (name, path) in enumerate({"a": "0.0", "b": "0.1", "c": "0.0"}.items()):
            swarm.start_node(name, path=path, max_rounds=4, seed=i,
                             extra=[*NODE_ARGS, "--wait-peers", "3", "--identity", str(keys[name])],
                             entry=["-m", "tests.lying_node", "3"] if name == "a" else None)
        codes = swarm.wait_nodes(["b", "c"], timeout_s=150)
        assert codes == {"b": 0, "c": 0}, [swarm.tail(n, 15) for n in ("b", "c")]
        liar = peer_id_of_identity(keys["a"])
        assert "LYING: round 0 " in (tmp_path / "swarm" / "a.log").read_text(), swarm.tail("a", 20)
        st = {n: swarm.status(n) for n in ("b", "c")}
        me = {n: s["peer_id"] for n, s in st.items()}
        for n, s in st.items():
            assert "not what its frames give" in s["distrusted"].get(liar, ""), (n, s["distrusted"], swarm.tail(n, 20))
            assert s["rounds_retried"] >= 1, (n, swarm.tail(n, 20))
            # round 0 of `shared` (the state at round 1) was merged, by b and c, without the liar, and in the round
            # the lie was in: no round of `shared` failed (before the failover, round 0 failed for both, and its
            # next attempt merged the same pair)
            assert sorted(s["groups"]["shared"]["1"]) == sorted(me.values()), (n, s["groups"]["shared"])
            assert s["rounds_missed"].get("shared", [0, 0])[1] == 0, (n, s["rounds_missed"], swarm.tail(n, 20))
        assert st["b"]["history"]["shared"]["1"] == st["c"]["history"]["shared"]["1"]
        mismatches, compared = replica_mismatches(list(st.values()))
        assert not mismatches and compared >= 4, (mismatches, compared)
    finally:
        swarm.close()


@pytest.mark.slow  # ~40 s: 8 nodes on 2 cores
def test_in_a_group_of_eight_a_lie_in_the_probation_is_never_applied(tmp_path):
    """A group of 8 on one path; a (its peer id sorts first, so it reduces) lies from its very first round with a mean
    that points the group's way (the mean plus noise of its norm: no member's suspicion checks it for certain). Every
    member checks a new reducer's first rounds before applying them: each catches the lie and fails over, none
    applies it, every honest node distrusts a and merged its last rounds without it, and the honest replicas agree
    in every round. (Drawing 4 checkers of the 7 instead, as docs/SECURITY.md argues for at scale, split a round
    between the checkers and the members that applied the lie in 2 runs of 2 here: not built.)"""
    names = ["a", *[f"h{i}" for i in range(7)]]
    keys = identities_with_first(tmp_path, *names)
    spec_path = tmp_path / "swarm.toml"
    spec_path.write_text(hostile_spec().to_toml())
    swarm = LocalSwarm(spec_path, tmp_path / "swarm")
    honest = names[1:]
    try:
        swarm.start_bootstrap()
        for i, name in enumerate(names):
            swarm.start_node(name, path="0.0", max_rounds=6, seed=i,
                             extra=["--max-tokens-per-s", "1280", "--wait-peers", "8", "--identity", str(keys[name])],
                             entry=["-m", "tests.lying_node", "3", "0", "noise1"] if name == "a" else None)
        codes = swarm.wait_nodes(honest, timeout_s=400)
        assert codes == dict.fromkeys(honest, 0), [swarm.tail(n, 15) for n in honest if codes[n]]
        liar = peer_id_of_identity(keys["a"])
        assert "LYING: round 0 " in (tmp_path / "swarm" / "a.log").read_text(), swarm.tail("a", 20)
        st = {n: swarm.status(n) for n in honest}
        for n, s in st.items():
            assert "not what its frames give" in s["distrusted"].get(liar, ""), (n, s["distrusted"], swarm.tail(n, 20))
            last = max(map(int, s["groups"]["shared"]))
            assert last >= 5 and liar not in s["groups"]["shared"][str(last)], (n, s["groups"]["shared"])
        met = {n: (s["rounds_retried"], s["rounds_undone"]) for n, s in st.items()}
        assert all(retried >= 1 and undone == 0 for retried, undone in met.values()), met  # caught, never applied
        mismatches, compared = replica_mismatches(list(st.values()))
        assert not mismatches and compared >= 10, (mismatches, compared)
    finally:
        swarm.close()
