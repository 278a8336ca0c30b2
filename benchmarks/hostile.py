"""Hostile peers against a longer swarm than the tests' (issue 17, docs/SECURITY.md): honest loss against a clean
run, rounds lost, bytes on the wire, replica agreement.

A bootstrap peer and two honest node processes on 127.0.0.1 (paths 0.0 and 0.1 of a 2x2 spec: both hold `shared`
and `L0M0`; H = 10, paced to 5 inner steps a second) train `--rounds` rounds in each arm, `--repeats` times; a
third node (path 1.0: it shares `shared`) joins a third of the way in and trains a third as many rounds. Arms:
- `clean`: nobody hostile;
- `forged-state`: tests/hostile_peer.py serves a forged `shared` 50 rounds ahead (anchor 1e3, self-consistent
  digest), announces it, and sends node a contributions claiming that round for the whole run (before the vouching
  rule both the victim and the node that joins mid-run adopted the forged state);
- `dht-stuffing`: tests/hostile_dht.py, every 5 s, writes a key outside the swarm, a claim that expires in four
  months, an oversized announcement and two forgeries of the bootstrap peer's served swarm;
- `lying-reducer`: a third node on path 0.0 (tests/lying_node.py), its peer id ground to sort before the honest
  ones so that it reduces `shared` and `L0M0` from round 0, sends its group the sign-flipped mean of every round
  that merges three contributions; the honest nodes audit at the default rate (`--audit-rate 0.2`: each audits a
  round with probability 0.2 / 3), so the lie goes on until an audit catches it;
- `flood`: tests/hostile_flood.py floods node a for the whole run, 8 requests at a time, every kind its exchange
  serves (state downloads left unread, junk contributions, stance questions, audit-frame requests);
- `silent-claimant` (issue 27): a third node on path 0.0 that claims `shared` and `L0M0` and never contributes (a
  real node paced to 1 token/s: its first round would take minutes); the goal reads the honest nodes' rounds per
  second against the clean arm's (≥ 0.9) besides their loss;
- `late-liar` (issue 27): the lying reducer of `lying-reducer`, honest through its checked rounds, lying from round
  6 of each module on (past its 3 checked rounds: its lies, inside the members' bound, are applied until an audit
  catches one, and then undone: protocol/rounds/heal.py);
- `late-liar-huge` (issue 27): the same, sending -1e4 × the true mean (the kind of lie that once set the anchors to
  ~3e4): beyond every member's bound (protocol/rounds/rule.py `mean_bound`), refused before it is applied;
- `late-liar-noise` (issue 27): the same, sending the true mean plus noise 3 × its norm: inside the bound and
  pointing our way (not `suspicious`), so applied until a random audit catches one, then undone
  (protocol/rounds/heal.py);
- `fourth-honest`: the liar's node of those arms (same identity ground to reduce first, same path, same seed)
  that never lies: the lie arms' swarm without the lie. Their swarm has a node on path 0.0 that the clean arm
  lacks, whose honest rounds move the modules a and b share towards path 0.0's documents (measured on 2623d5c: a
  2.9 % lower, b 9.9 % higher than clean), and the lie arms have it until their liar is caught and left out. So each lie
  arm's loss is also written against this one (`loss_ratio_same_swarm`): the lie arms' honest losses fall between
  the two baselines, and what the lie costs is read beside both. The goal reads the clean arm, as issue 27 states it;
- `fourth-leaves`: the same honest node, leaving after its round LIE_FROM − 1: the lie arms' swarm as it is once
  their liar is caught at its first lie (`late-liar`, `late-liar-huge`: refused before anyone applies it, the liar
  left out from then on), without the lie. Each lie arm's loss is written against it too (`loss_ratio_matched`).
Besides the loss, each lie's arm reads the largest |value| the honest anchors took in the run (`anchor_max_abs`)
against the clean arm's (≤ ANCHOR_GOAL), and the rounds the honest nodes undid.
Contributions with bounded, scaled, sign-flipped, NaN or wrong-shape outer gradients are measured by
benchmarks/byzantine.py on the node's round rule (a simulator: it needs no network to show the screen's effect).

Per arm and honest node: the loss of its final checkpoint on a held-out set (HELDOUT_DOCS generated documents the
swarm never trained on, routed to the node's path: about 250 a path; mean over repeats, each repeat, and the ratio
to the clean arm, which the goal reads; beside it the same averaged over the two checkpoints each node keeps,
`loss_ratio_kept`, less moved by a one-round spike at the final anchor), the node's own final validation loss
beside it (3 documents a path in this spec: it swings by 10-30 % between rounds, too noisy for a 2 % goal), rounds
failed and rounds sent again after a lie caught before applying, bytes sent + received, replica mismatches, exit
codes. JSON + a PNG of the ratios.

    python benchmarks/hostile.py                          # ≈ 45 min on 2 cores (11 arms × 3 repeats)
    python benchmarks/hostile.py --rounds 10 --repeats 1  # a quick look

Goal (issue 17): each attack's honest loss within 2 % of the clean run's, replicas identical, no node crashed.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _swarm_common import REPO, arguments, machine, read_json, save_plot, write_json

from pathswarm.node.app.local_swarm import LocalSwarm
from pathswarm.node.app.replicas import replica_mismatches
from pathswarm.node.app.swarm_init import init_spec
from pathswarm.node.model.data import synthetic_corpus
from pathswarm.protocol.spec import AveragingSpec, DataSpec, InnerOptSpec, ModelSpec, SwarmSpec

H, STEPS_PER_S, BATCH, CONTEXT = 10, 5, 4, 32
HONEST = {"a": "0.0", "b": "0.1"}
JOINER_PATH = "1.0"  # its L0M1 is a module nobody has trained before it joins
ARMS = ("clean", "forged-state", "dht-stuffing", "lying-reducer", "flood", "silent-claimant", "late-liar",
        "late-liar-huge", "late-liar-noise", "fourth-honest", "fourth-leaves")
LIE_FROM = 6
"""The late liars' first lying round (`--lie-from`); `fourth-leaves` trains the rounds before it. Its checked rounds
are 0-2 (NEW_REDUCER_AUDITS), so 3 is the earliest a liar past them can lie: 6 leaves a margin, at the price of 6
honest rounds on a's path that pull the modules b shares towards a's documents (`fourth-leaves`: b ~2 % above
clean)."""
NEVER = 10**9  # a first lying round no run reaches
LATE = -1  # in LIAR_ARMS: the run's --lie-from
LIAR_ARMS = {"lying-reducer": (0, "-1"), "late-liar": (LATE, "-1"), "late-liar-huge": (LATE, "-1e4"),
             "late-liar-noise": (LATE, "noise3"), "fourth-honest": (NEVER, "-1"), "fourth-leaves": (NEVER, "-1")}
"""The liar's (first lying round of a module, factor of the true mean it sends) in each arm (tests/lying_node.py);
`fourth-honest`'s first lying round is never reached."""
SAME_SWARM = "fourth-honest"  # the lie arms' swarm, nobody lying: their second baseline, beside clean
MATCHED = "fourth-leaves"  # ... and that swarm as it is once the liar is caught at its first lie: the third
CONTROLS = {SAME_SWARM: "loss_ratio_same_swarm", MATCHED: "loss_ratio_matched"}
"""Each control arm → the key of a lie arm's honest loss ratios against it."""
ANCHOR_GOAL = 1.1  # a lie's arm: the honest anchors' largest |value| in the run ≤ this × the clean arm's
SPEED_GOAL = 0.9  # a silent claimant: the honest nodes' rounds per second ≥ this × the clean arm's
GOAL = 0.02
HELDOUT_DOCS, HELDOUT_SEED, HELDOUT_BATCHES = 1000, 12345, 200  # 200 batches × 4 × 32 bytes a path


def spec_text() -> str:
    base = SwarmSpec(name="hostile-bench", levels=(2, 2),
                     model=ModelSpec(width=32, base_width=32, n_heads=2, layers_per_module=1, context_len=CONTEXT),
                     inner=InnerOptSpec(steps=H, batch_size=BATCH, warmup_steps=2), data=DataSpec(corpus="synthetic"),
                     averaging=AveragingSpec(grace_s=3.0, timeout_s=10.0, claim_ttl_s=8.0))
    return init_spec(base, synthetic_corpus(200, seed=0)).to_toml()


def pace() -> list[str]:
    return ["--max-tokens-per-s", str(STEPS_PER_S * BATCH * CONTEXT)]


def ground_identities(root: Path, first: str, others: list[str]) -> dict[str, Path]:
    """Identity files whose `first` peer id sorts before every one of `others` (a few tries: ids are cheap)."""
    from pathswarm.protocol.identity import ensure_identity, peer_id_of_identity

    keys = {n: root / f"{n}.key" for n in (first, *others)}
    for n in others:
        ensure_identity(keys[n])
    while True:
        keys[first].unlink(missing_ok=True)
        ensure_identity(keys[first])
        if all(peer_id_of_identity(keys[first]) < peer_id_of_identity(keys[n]) for n in others):
            return keys


def wait_round(swarm: LocalSwarm, name: str, round_: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while (swarm.status(name) or {}).get("round", 0) < round_:
        if time.monotonic() > deadline or name not in swarm.running():
            raise SystemExit(f"node {name} did not reach round {round_}: {swarm.tail(name, 10)}")
        time.sleep(0.2)


def heldout_losses(spec_path: Path, checkpoints: dict[str, tuple[str, Path]]) -> dict[str, float]:
    """Each node's final checkpoint (`checkpoints`: name → (path, checkpoint dir)) on HELDOUT_DOCS documents the
    swarm never trained on (a fixed set, the same in every arm), routed to its path: about 250 documents a path
    instead of the node's own validation split (3 short documents a path in this spec, whose loss swings by
    10-30 % between consecutive rounds)."""
    import torch

    from pathswarm.node.model.data import TokenSampler
    from pathswarm.node.model.router import documents_by_path
    from pathswarm.node.train.checkpoint import load_checkpoint
    from pathswarm.node.train.evaluate import model_from_checkpoint
    from pathswarm.node.train.inner import evaluate_loss
    from pathswarm.protocol.spec import load_spec, parse_path

    spec = load_spec(spec_path)
    by_path = documents_by_path(spec, synthetic_corpus(HELDOUT_DOCS, seed=HELDOUT_SEED))
    out = {}
    with torch.no_grad():
        for name, (text, directory) in checkpoints.items():
            path = parse_path(text, spec)
            model = model_from_checkpoint(spec, load_checkpoint(str(directory), spec, spec.module_ids(path)), path)
            batches = TokenSampler(by_path[path], CONTEXT, seed=0).eval_batches(BATCH, HELDOUT_BATCHES)
            out[name] = evaluate_loss(model, batches)[0]
    return out


def heldout_kept(spec_path: Path, checkpoints: dict[str, tuple[str, Path]]) -> dict[str, float]:
    """Each node's held-out loss averaged over the rounds its checkpoint keeps (the last two): the final anchor alone
    can catch a one-round spike (a clean repeat's node a: 1.732 at round 29, 1.903 at round 30), which alone made the
    clean arm's spread 10 %."""
    from pathswarm.node.train.checkpoint import complete_rounds

    out = {}
    for name, (text, directory) in checkpoints.items():
        kept = complete_rounds(Path(directory)) or [Path(directory)]
        out[name] = statistics.fmean(heldout_losses(spec_path, {name: (text, d)})[name] for d in kept)
    return out


def run_arm(arm: str, rounds: int, workdir: Path, lie_from: int = LIE_FROM) -> dict:
    workdir.mkdir(parents=True)
    spec_path = workdir / "swarm.toml"
    spec_path.write_text(spec_text())
    hostile: subprocess.Popen | None = None
    stop = threading.Event()
    liar_arm = arm in LIAR_ARMS
    keys = ground_identities(workdir, "liar", list(HONEST)) if liar_arm else {}
    third = liar_arm or arm == "silent-claimant"
    with LocalSwarm(spec_path, workdir / "run") as swarm:
        swarm.start_bootstrap()
        for i, (name, path) in enumerate(HONEST.items()):
            ident = ["--identity", str(keys[name])] if keys else []
            swarm.start_node(name, path=path, max_rounds=rounds, seed=i,
                             extra=["--wait-peers", "3" if third else "2", *pace(), *ident])
        if liar_arm:  # holds `shared` and `L0M0` with a and b; lies in rounds that merge all three
            first, factor = LIAR_ARMS[arm]
            swarm.start_node("liar", path="0.0", max_rounds=lie_from if arm == MATCHED else rounds, seed=7,
                             entry=["-m", "tests.lying_node", "3", str(lie_from if first == LATE else first), factor],
                             extra=["--wait-peers", "3", *pace(), "--identity", str(keys["liar"])])
        if arm == "silent-claimant":  # claims path 0.0 (so `shared` and `L0M0`) and never finishes a round
            swarm.start_node("silent", path="0.0", max_rounds=rounds, seed=7,
                             extra=["--wait-peers", "3", "--max-tokens-per-s", "1"])
        for name in HONEST:
            swarm.wait_ready(name)
        if arm == "flood":  # for most of the run: it then writes its report and leaves
            seconds = rounds * H / STEPS_PER_S * 0.8
            hostile = subprocess.Popen(
                [sys.executable, "-m", "tests.hostile_flood", str(spec_path), swarm.maddr,
                 str(swarm.node_files("a")["status.json"]), str(workdir / "flood.json"), str(seconds)],
                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        elif arm == "forged-state":
            seconds = rounds * H / STEPS_PER_S + 30
            hostile = subprocess.Popen(
                [sys.executable, "-m", "tests.hostile_peer", str(spec_path), swarm.maddr,
                 str(swarm.node_files("a")["status.json"]), str(workdir / "hostile.json"), str(seconds)],
                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            if hostile.stdout.readline().strip() != "announced":
                raise SystemExit("the hostile peer did not start")
        elif arm == "dht-stuffing":
            def stuff() -> None:
                while not stop.wait(5.0):
                    subprocess.run([sys.executable, "-m", "tests.hostile_dht", str(spec_path), swarm.maddr,
                                    str(workdir / "hostile-dht.json")], cwd=REPO, capture_output=True, timeout=120)

            threading.Thread(target=stuff, daemon=True).start()
        # A third of the run in, a node joins (in every arm, so the arms differ only by the attack): next to the
        # forged state in `forged-state`. "A third" is node a's round, not a time: an arm whose rounds take longer
        # (a fourth process on 2 cores, a failover) would otherwise meet the joiner, and its untrained module, at an
        # earlier stage of training, which alone moved a's final loss by several %.
        wait_round(swarm, "a", rounds // 3, timeout_s=rounds * H / STEPS_PER_S * 4)
        swarm.start_node("c", path=JOINER_PATH, max_rounds=max(2, rounds // 3), seed=2, extra=pace())
        names = [*HONEST, "c"]
        codes = swarm.wait_nodes(names, timeout_s=rounds * H / STEPS_PER_S * 4 + 120)
        stop.set()
        if hostile is not None:
            if arm == "flood":
                try:
                    hostile.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    pass
            hostile.kill()
        st = {n: swarm.status(n) or {} for n in names}
        liar = swarm.status("liar") if liar_arm else None
        lies = (workdir / "run" / "liar.log").read_text().count("LYING") if liar is not None else None
        ckpts = {n: (p, swarm.node_files(n)["checkpoint"]) for n, p in {**HONEST, "c": JOINER_PATH}.items()}
        heldout, kept = heldout_losses(spec_path, ckpts), heldout_kept(spec_path, ckpts)
    mismatches, compared = replica_mismatches(list(st.values()))
    forged = read_json(str(workdir / "hostile.json")) if (workdir / "hostile.json").exists() else None
    return {
        "exit_codes": codes,
        "val_loss": {n: st[n].get("val_loss_after") for n in HONEST},
        "heldout_loss": heldout,
        "heldout_loss_kept": kept,
        "rounds_failed": {n: st[n].get("rounds_failed", 0) for n in HONEST},
        "rounds_per_s": {n: st[n].get("round", 0) / max(st[n].get("train_wall_s") or 0.0, 1e-9) for n in HONEST},
        "rounds_retried": {n: st[n].get("rounds_retried", 0) for n in HONEST},
        "rounds_undone": {n: st[n].get("rounds_undone", 0) for n in HONEST},
        "anchor_max_abs": {m: max(st[n].get("anchor_max_abs", {}).get(m, 0.0) for n in HONEST)
                           for m in st["a"].get("anchor_max_abs", {})},
        "bytes": {n: st[n].get("bytes_sent", 0) + st[n].get("bytes_received", 0) for n in HONEST},
        "replica_mismatches": len(mismatches), "digests_compared": compared,
        "forged_state_adopted": None if forged is None else any(
            forged["forged_digest"] in s.get("history", {}).get("shared", {}).values() for s in st.values()),
        "victim_answers": None if forged is None else forged["answers"],
        "rounds_lied": lies,
        "liar_caught_by": None if liar is None else sorted(
            n for n in HONEST if liar.get("peer_id", "?") in st[n].get("distrusted", {})),
        "flood": read_json(str(workdir / "flood.json")) if (workdir / "flood.json").exists() else None,
    }


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    attacks = [a for a in ARMS if a != "clean" and a in result["arms"]]
    width = 0.35
    for j, node in enumerate(HONEST):
        ratios = [result["arms"][a]["loss_ratio"][node] for a in attacks]
        ax.bar([i + (j - 0.5) * width for i in range(len(attacks))], ratios, width, label=f"honest node {node}")
        for key, marker, what in ((CONTROLS[SAME_SWARM], "_", f"÷ {SAME_SWARM} (the lie arms' swarm, no lie)"),
                                  (CONTROLS[MATCHED], "x", f"÷ {MATCHED} (… its fourth node leaving at round "
                                                           f"{result.get('lie_from', LIE_FROM)})")):
            marks = [(i + (j - 0.5) * width, result["arms"][a][key][node])
                     for i, a in enumerate(attacks) if key in result["arms"][a]]
            if marks:
                ax.scatter(*zip(*marks, strict=True), color="black", marker=marker, s=60, zorder=3,
                           label=what if j == 0 else None)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axhline(1.0 + GOAL, color="tab:red", ls="--", lw=0.8, label="goal: within 2 % of clean")
    ax.set_xticks(range(len(attacks)), attacks)
    ax.set_ylabel("final held-out loss / clean run's")
    ax.set_title(f"hostile peers, {result['rounds']} rounds × {result['repeats']} repeats")
    shown = [v for a in attacks for key in ("loss_ratio", *CONTROLS.values())
             for v in result["arms"][a].get(key, {}).values()]
    ax.set_ylim(min(0.95, min(shown) - 0.01), max(1.05, 1.0 + 2 * GOAL, max(shown) + 0.01))
    ax.legend(fontsize=8)
    save_plot(fig, path)


def main() -> None:
    ap = arguments(__doc__, "hostile", plot=True, replot=True)
    ap.add_argument("--rounds", type=int, default=30, help="rounds each honest node trains per run")
    ap.add_argument("--repeats", type=int, default=3, help="runs per arm (run-to-run spread is several %%)")
    ap.add_argument("--lie-from", type=int, default=LIE_FROM,
                    help="the late liars' first lying round of a module (≥ 3: its rounds 0-2 are checked)")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated arms among {', '.join(ARMS)} "
                    "(clean is always run: the others are measured against it)")
    ap.add_argument("--workdir", default="", help="keep every run's logs, statuses and checkpoints here")
    args = ap.parse_args()
    if args.lie_from < 3:
        ap.error(f"--lie-from {args.lie_from}: a reducer's rounds 0-2 are checked before they are applied (use ≥ 3)")
    arms_run = ["clean", *(a for a in args.arms.split(",") if a in ARMS and a != "clean")]
    if args.replot:
        plot(read_json(args.json), args.plot)
        return
    t0 = time.monotonic()
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))  # tests.*
    runs: dict[str, list[dict]] = {a: [] for a in arms_run}
    with tempfile.TemporaryDirectory(prefix="pathswarm-hostile-") as scratch:
        tmp = args.workdir or scratch
        for rep in range(args.repeats):
            for arm in arms_run:  # interleaved: a slow patch of the machine hits every arm alike
                got = run_arm(arm, args.rounds, Path(tmp) / f"{arm}-{rep}", args.lie_from)
                runs[arm].append(got)
                print(f"repeat {rep + 1}/{args.repeats} {arm}: held-out loss {got['heldout_loss']}, "
                      f"val loss {got['val_loss']}, "
                      f"failed rounds {got['rounds_failed']}, mismatches {got['replica_mismatches']}", flush=True)
    mean = {arm: {n: statistics.fmean(r["val_loss"][n] for r in rs) for n in HONEST} for arm, rs in runs.items()}
    held = {arm: {n: statistics.fmean(r["heldout_loss"][n] for r in rs) for n in rs[0]["heldout_loss"]}
            for arm, rs in runs.items()}  # the joiner's too (its own path: the goal reads a's and b's)
    kept = {arm: {n: statistics.fmean(r["heldout_loss_kept"][n] for r in rs) for n in rs[0]["heldout_loss_kept"]}
            for arm, rs in runs.items()}
    arms = {}
    for arm, rs in runs.items():
        arms[arm] = {
            "heldout_loss_mean": held[arm], "heldout_loss_runs": [r["heldout_loss"] for r in rs],
            "loss_ratio": {n: held[arm][n] / held["clean"][n] for n in HONEST},
            # beside the goal's figure: the same, each node's loss averaged over its two kept checkpoints
            "heldout_loss_kept_mean": kept[arm], "heldout_loss_kept_runs": [r["heldout_loss_kept"] for r in rs],
            "loss_ratio_kept": {n: kept[arm][n] / kept["clean"][n] for n in kept[arm]},
            "val_loss_mean": mean[arm], "val_loss_runs": [r["val_loss"] for r in rs],
            "val_loss_ratio": {n: mean[arm][n] / mean["clean"][n] for n in HONEST},
            "rounds_retried": sum(sum(r["rounds_retried"].values()) for r in rs),
            "rounds_failed": sum(sum(r["rounds_failed"].values()) for r in rs),
            "rounds_undone": sum(sum(r["rounds_undone"].values()) for r in rs),
            "anchor_max_abs": {m: max(r["anchor_max_abs"].get(m, 0.0) for r in rs) for m in rs[0]["anchor_max_abs"]},
            "anchor_max_abs_runs": [r["anchor_max_abs"] for r in rs],
            "bytes_per_node_run": statistics.fmean(b for r in rs for b in r["bytes"].values()),
            "replica_mismatches": sum(r["replica_mismatches"] for r in rs),
            "crashed": sum(c != 0 for r in rs for c in r["exit_codes"].values()),
            "forged_state_adopted": any(r["forged_state_adopted"] for r in rs),
            "victim_answers": [r["victim_answers"] for r in rs if r["victim_answers"] is not None],
            "rounds_lied": [r["rounds_lied"] for r in rs if r["rounds_lied"] is not None],
            "liar_caught_by": [r["liar_caught_by"] for r in rs if r["liar_caught_by"] is not None],
            "flood_requests_sent": [sum(r["flood"]["sent"].values()) for r in rs if r["flood"]],
            "rounds_per_s": {n: statistics.fmean(r["rounds_per_s"][n] for r in rs) for n in HONEST},
        }
    for arm in arms:
        clean_max = arms["clean"]["anchor_max_abs"]
        arms[arm]["anchor_ratio"] = max((v / max(clean_max.get(m, 0.0), 1e-30)
                                         for m, v in arms[arm]["anchor_max_abs"].items() if m in clean_max),
                                        default=0.0)
        # The same figure's own run-to-run spread: the largest over the arm's repeats ÷ the smallest, per module
        # (a clean arm's says how much of a lie arm's ratio the trajectories' noise alone can make).
        runs_max = arms[arm]["anchor_max_abs_runs"]
        arms[arm]["anchor_spread"] = max((max(r.get(m, 0.0) for r in runs_max)
                                          / max(min(r.get(m, 0.0) for r in runs_max), 1e-30)
                                          for m in runs_max[0]), default=0.0)
        arms[arm]["speed_ratio"] = {n: arms[arm]["rounds_per_s"][n] / max(arms["clean"]["rounds_per_s"][n], 1e-9)
                                    for n in HONEST}
    attacks = [a for a in arms_run if a not in ("clean", *CONTROLS)]  # the controls: baselines, no attack
    for a in attacks:
        for control, key in CONTROLS.items():
            if a in LIAR_ARMS and control in arms:
                arms[a][key] = {n: held[a][n] / held[control][n] for n in HONEST}

    meets = all(max(arms[a]["loss_ratio"].values()) <= 1 + GOAL and arms[a]["replica_mismatches"] == 0
                and arms[a]["crashed"] == 0 and not arms[a]["forged_state_adopted"]
                and (a != "silent-claimant" or min(arms[a]["speed_ratio"].values()) >= SPEED_GOAL)
                and (a not in LIAR_ARMS or arms[a]["anchor_ratio"] <= ANCHOR_GOAL) for a in attacks)
    result = {"benchmark": "hostile", "rounds": args.rounds, "repeats": args.repeats, "lie_from": args.lie_from,
              "machine": machine(),
              "arms": arms, "goal": "each attack: honest loss within 2 % of clean, replicas identical, no crash; "
              "a silent claimant: rounds per second >= 0.9 x clean's; a liar: the honest anchors' largest |value| "
              "<= 1.1 x clean's",
              "meets_goal": meets, "wall_s": round(time.monotonic() - t0, 1)}
    for a in [*attacks, *(c for c in CONTROLS if c in arms)]:
        for control, key in CONTROLS.items():
            if key in arms[a]:
                print(f"{a}: honest loss / {control} = {', '.join(f'{n} {r:.3f}' for n, r in arms[a][key].items())}")
        print(f"{a}: honest loss / clean = {', '.join(f'{n} {r:.3f}' for n, r in arms[a]['loss_ratio'].items())}; "
              f"rounds/s / clean = {', '.join(f'{n} {r:.3f}' for n, r in arms[a]['speed_ratio'].items())}; "
              f"largest |anchor| / clean = {arms[a]['anchor_ratio']:.3f} (clean's own spread "
              f"{arms['clean']['anchor_spread']:.3f}); rounds undone {arms[a]['rounds_undone']}; over the kept "
              f"checkpoints / clean = {', '.join(f'{n} {r:.3f}' for n, r in arms[a]['loss_ratio_kept'].items())}")
    write_json(args.json, result)
    plot(result, args.plot)


if __name__ == "__main__":
    main()
