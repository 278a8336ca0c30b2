"""benchmarks/_baselines.py, the worker of vs_peers' baseline arms: the settings each arm records, its batch sizes
and stop rule (pure; two DDP workers on loopback: tests/swarm/test_baselines_ddp.py)."""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

import pytest

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
