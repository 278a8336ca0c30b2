"""benchmarks/_baselines.py, the worker of vs_peers' baseline arms: the settings each arm records, its batch sizes
and stop rule (fast); and two DDP workers on loopback that end with the same weights and a lower loss (slow)."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import tiny_spec

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.append(str(BENCHMARKS))  # the benchmarks import each other by bare name (`from _swarm_common import`)

import _baselines as bl  # noqa: E402


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("baselines") / "spec.toml"
    path.write_text(tiny_spec().to_toml())
    return path


def argv(kind: str, spec_file: Path, out: Path, *extra: str, rank: int = 0, world: int = 4) -> list[str]:
    return [kind, "--rank", str(rank), "--world", str(world), "--ip", "127.0.0.1", "--spec", str(spec_file),
            "--out", str(out), "--tokens-per-node", "100000", "--time-cap", "60", *extra]


def test_samples_per_update_is_the_global_batch_of_each_arm():
    # 8 workers of batch 8: DDP steps on 64 samples, with 4 micro-steps on 256; hivemind accumulates as many across
    # peers as ddp-accum (same A); hivemind-local averages every H local steps' worth of the collaboration.
    assert bl.samples_per_update("ddp", 8, 8, accum=4, H=50) == 64
    assert bl.samples_per_update("ddp-accum", 8, 8, accum=4, H=50) == 256
    assert bl.samples_per_update("hivemind", 8, 8, accum=4, H=50) == 256
    assert bl.samples_per_update("hivemind-local", 8, 8, accum=4, H=50) == 8 * 8 * 50
    assert bl.micro_steps_per_step("ddp", 4) == 1 and bl.micro_steps_per_step("ddp-accum", 4) == 4


def test_stop_rule_tokens_first_then_time_cap():
    assert bl.stop_reason(999, 10.0, tokens_per_node=1000, time_cap_s=60) is None
    assert bl.stop_reason(1000, 10.0, tokens_per_node=1000, time_cap_s=60) == bl.DONE
    assert bl.stop_reason(10, 60.0, tokens_per_node=1000, time_cap_s=60) == bl.TIME_CAP
    assert bl.stop_reason(1000, 61.0, tokens_per_node=1000, time_cap_s=60) == bl.DONE  # both: the budget was met


def test_ddp_settings(spec_file, tmp_path):
    spec = tiny_spec()
    args = bl.parse(argv("ddp-accum", spec_file, tmp_path, "--accum", "3", "--master-ip", "10.78.0.2",
                         "--port", "29600", "--ifname", "eth0"))
    s = bl.arm_settings(args, spec)
    B, T = spec.inner.batch_size, spec.model.context_len
    assert (s["accum"], s["global_batch"], s["samples_per_update"]) == (3, 4 * B * 3, 4 * B * 3)
    assert s["tokens_per_local_step"] == B * T
    assert s["rendezvous"].startswith("TCPStore at 10.78.0.2:29600") and s["gloo_socket_ifname"] == "eth0"
    assert s["ddp"]["no_sync_on_first_micro_steps"] == 2
    assert s["optimizer"]["betas"] == [spec.inner.beta1, spec.inner.beta2]
    assert s["warmup_steps"] == spec.inner.warmup_steps and s["grad_clip"] == spec.inner.grad_clip
    lrs = sorted(g["lr"] for g in s["optimizer"]["param_groups"])
    assert lrs[-1] == spec.inner.lr and lrs[0] == spec.inner.lr / spec.model.width_mult  # muP's hidden-matrix lr
    # plain ddp ignores --accum: one micro-step per step
    s = bl.arm_settings(bl.parse(argv("ddp", spec_file, tmp_path, "--accum", "3")), spec)
    assert (s["accum"], s["global_batch"]) == (1, 4 * B)
    json.dumps(s)  # goes into the benchmark's JSON as it is


def test_hivemind_settings_follow_the_docs(spec_file, tmp_path):
    import hivemind
    from hivemind.compression import Float16Compression

    spec = tiny_spec()
    B = spec.inner.batch_size
    s = bl.arm_settings(bl.parse(argv("hivemind", spec_file, tmp_path, "--accum", "4")), spec)
    opt = s["hivemind_optimizer"]
    assert opt["target_batch_size"] == 4 * B * 4 and opt["batch_size_per_step"] == B
    assert opt["use_local_updates"] is False and opt["offload_optimizer"] is True
    assert opt["grad_compression"] == opt["state_averaging_compression"] == "Float16Compression"
    assert (opt["matchmaking_time"], opt["averaging_timeout"]) == (bl.MATCHMAKING_TIME_S, bl.AVERAGING_TIMEOUT_S)

    local = bl.arm_settings(bl.parse(argv("hivemind-local", spec_file, tmp_path, "--H", "7")), spec)
    lopt = local["hivemind_optimizer"]
    assert lopt["use_local_updates"] is True and lopt["target_batch_size"] == 4 * B * 7
    assert "grad_compression" not in lopt  # no gradients are averaged with local updates
    # --H defaults to the spec's H
    default = bl.arm_settings(bl.parse(argv("hivemind-local", spec_file, tmp_path)), spec)
    assert default["hivemind_optimizer"]["target_batch_size"] == 4 * B * spec.inner.steps

    # Every recorded argument is one hivemind.Optimizer takes, and the compression names become its objects.
    accepted = set(inspect.signature(hivemind.Optimizer.__init__).parameters)
    for recorded in (opt, lopt):
        assert set(recorded) <= accepted, set(recorded) - accepted
        real = bl.hivemind_compression(recorded)
        assert isinstance(real["state_averaging_compression"], Float16Compression)
    json.dumps(s), json.dumps(local)


def test_a_step_blocked_past_the_time_cap_is_cut_short(spec_file, tmp_path):
    """A collective that waits for a departed peer must not hold the worker past the cap: SIGALRM interrupts it
    (here a wait on an event that nobody sets) --overrun-s after the cap."""
    import signal
    import threading
    import time

    args = bl.parse(argv("ddp", spec_file, tmp_path, "--time-cap", "0.1", "--overrun-s", "0.2"))
    rec = bl.Record(args, {}, tokens_per_step=1)
    previous = signal.getsignal(signal.SIGALRM)
    try:
        rec.start()
        begun = time.monotonic()
        with pytest.raises(bl.Overrun):
            threading.Event().wait(10)
        assert 0.25 < time.monotonic() - begun < 5
        assert rec.overran and rec.should_stop() == bl.OVERRUN  # also when the step swallowed the exception
    finally:
        rec.disarm()
        signal.signal(signal.SIGALRM, previous)


def test_dht_listens_on_the_given_ip_and_contacts_nothing_else():
    args = bl.dht_args("10.78.0.5")
    assert args["host_maddrs"] == ["/ip4/10.78.0.5/tcp/0"]
    assert not any(args[k] for k in ("use_relay", "use_auto_relay", "auto_nat", "nat_port_map", "use_ipfs"))


def test_interface_of_loopback():
    assert bl.interface_of("127.0.0.1") == "lo"
    assert bl.interface_of("192.0.2.77") is None  # TEST-NET-1: held by no interface here


def test_bad_rank_is_refused(spec_file, tmp_path):
    with pytest.raises(SystemExit):
        bl.parse(argv("ddp", spec_file, tmp_path, rank=4, world=4))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_ddp_workers_stay_identical_and_learn(spec_file, tmp_path):
    """Two `ddp` workers on loopback (in a fresh network namespace when we may make one: nothing else is reachable)
    for 40 steps: same final weights on both ranks, loss down, snapshots and both JSONs written."""
    steps = 40
    spec = tiny_spec()
    tokens = steps * spec.inner.batch_size * spec.model.context_len
    worker = str(BENCHMARKS / "_baselines.py")
    port = free_port()
    cmds = [[sys.executable, worker, *argv("ddp", spec_file, tmp_path, rank=r, world=2)[:-4],
             "--tokens-per-node", str(tokens), "--time-cap", "120", "--port", str(port), "--snap-every-s", "1"]
            for r in range(2)]
    quoted = [" ".join(f"'{c}'" for c in cmd) for cmd in cmds]
    script = (f"{quoted[0]} > '{tmp_path}/log-0.txt' 2>&1 & p0=$!; {quoted[1]} > '{tmp_path}/log-1.txt' 2>&1 & "
              "p1=$!; wait $p0; r0=$?; wait $p1; r1=$?; exit $((r0 | r1))")
    if os.geteuid() == 0 and shutil.which("unshare") and shutil.which("ip"):
        script = f"ip link set lo up && {{ {script}; }}"
        cmd = ["unshare", "-n", "sh", "-c", script]
    else:
        cmd = ["sh", "-c", script]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    logs = "\n".join((tmp_path / f"log-{r}.txt").read_text()[-3000:] for r in range(2))
    assert proc.returncode == 0, logs

    w = [json.loads((tmp_path / f"worker-{r}.json").read_text()) for r in range(2)]
    for r in range(2):
        assert w[r]["status"] == "ok" and w[r]["error"] is None, w[r]["error"]
        assert (w[r]["steps"], w[r]["local_steps"], w[r]["tokens"], w[r]["stop_reason"]) == (steps, steps, tokens,
                                                                                               bl.DONE)
        assert w[r]["settings"]["kind"] == "ddp" and w[r]["t0_epoch"] and w[r]["wall_s"] > 0
    assert w[0]["final_params_sha256"] == w[1]["final_params_sha256"]  # one all-reduce per step keeps replicas equal
    trace = w[0]["loss_trace"]
    assert trace[-1][2] < trace[0][2] - 0.3, trace
    assert [e[1] for e in trace][-1] == steps

    snaps = sorted(tmp_path.glob("snap-*.pt"))
    assert len(snaps) >= 2 and not list(tmp_path.glob(".snap-*"))  # no half-written snapshot left behind
    first, last = (torch.load(p) for p in (snaps[0], snaps[-1]))
    assert (first["step"], first["tokens"]) == (0, 0) and (last["step"], last["tokens"]) == (steps, tokens)
    assert set(last) == {"t", "step", "local_step", "tokens", "state_dict"}
    from pathswarm.node.model.model import build_path

    model = build_path(spec, spec.path_of_index(0))
    model.load_state_dict(last["state_dict"])  # the un-wrapped model's keys
