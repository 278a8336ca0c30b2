"""The shaped-link harness (tests/links.py) gives what its profiles say, measured from inside its namespaces:
round trip, rate in each direction, loss; contacts nothing outside; leaves nothing behind."""

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ..links import PROFILES, Links, LinksUnavailable, Profile, unavailable

pytestmark = pytest.mark.timeout(120)
PROBE = str(Path(__file__).resolve().parent.parent / "linkprobe.py")


@pytest.fixture(autouse=True)
def _need_links():
    why = unavailable()
    if why:
        pytest.skip(why)


def _tcp(net: Links, src: int, dst: int, nbytes: int) -> dict:
    server = subprocess.Popen([*net.exec_prefix(dst), sys.executable, PROBE, "serve", net.ip(dst), "5001"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        got = net.run_in(src, sys.executable, PROBE, "send", net.ip(dst), "5001", str(nbytes), timeout=60)
        assert got.returncode == 0, got.stderr
        return json.loads(got.stdout)
    finally:
        server.kill()
        server.wait()


def test_home_round_trip_and_upload_rate():
    with Links(PROFILES["home"], n=2) as net:
        got = _tcp(net, 0, 1, 3_000_000)
    # 40 ms between two home nodes; the jitter (σ ≈ 7 ms a round trip) moves a median of 20 by a few ms
    assert 0.034 <= got["rtt_s"] <= 0.040 * 1.25, got
    # 20 Mbit/s up; TCP over 0.2 % loss (both ends') and 40 ms gets most of it
    assert 0.6 * 20e6 <= got["bps"] <= 1.02 * 20e6, got


def test_each_direction_has_its_own_rate():
    slow_up = Profile("slow up", up_bps=4e6, down_bps=100e6, rtt_s=0.004)
    slow_down = Profile("slow down", up_bps=100e6, down_bps=2e6, rtt_s=0.004)
    with Links([slow_up, slow_down, slow_up]) as net:
        into_slow_down = _tcp(net, 0, 1, 600_000)  # 0's upload 4, 1's download 2: the download decides
        out_of_slow_up = _tcp(net, 0, 2, 1_200_000)  # 0's upload 4, 2's download 100
        out_of_slow_down = _tcp(net, 1, 2, 6_000_000)  # 1's upload 100, 2's download 100
    assert 0.8 * 2e6 <= into_slow_down["bps"] <= 1.02 * 2e6, into_slow_down
    assert 0.8 * 4e6 <= out_of_slow_up["bps"] <= 1.02 * 4e6, out_of_slow_up
    assert out_of_slow_down["bps"] > 5 * 4e6, out_of_slow_down
    assert all(0.004 <= x["rtt_s"] <= 0.008 for x in (into_slow_down, out_of_slow_up, out_of_slow_down))


def test_loss_is_each_ends_probability():
    lossy = Profile("lossy", up_bps=50e6, down_bps=50e6, rtt_s=0.002, loss=0.05)
    clean = Profile("clean", up_bps=50e6, down_bps=50e6, rtt_s=0.002)
    with Links([lossy, clean]) as net:
        recv = subprocess.Popen([*net.exec_prefix(1), sys.executable, PROBE, "udp-recv", net.ip(1), "5002", "6"],
                                stdout=subprocess.PIPE, text=True)
        assert recv.stdout.readline().strip() == "ready"
        sent = net.run_in(0, sys.executable, PROBE, "udp-send", net.ip(1), "5002", "2000")
        assert sent.returncode == 0, sent.stderr
        received = json.loads(recv.stdout.readline())["received"]
        recv.wait(10)
    # 5 % of 2,000 lost: 100 ± 10 (binomial); 5 standard deviations either way
    assert 2000 - 150 <= received <= 2000 - 50, received


def test_nothing_outside_is_reachable_and_nothing_is_left_behind():
    before = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    with Links(PROFILES["lan"], n=2) as net:
        names = [net.ns(0), net.ns(1), net.hub]
        outside = net.run_in(0, sys.executable, "-c",
                             "import socket; socket.create_connection(('192.0.2.1', 80), timeout=5)")
        assert "Network is unreachable" in outside.stderr  # no route: not even a packet leaves the node
        sleeper = subprocess.Popen([*net.exec_prefix(1), "sleep", "600"])
        probe = _tcp(net, 0, 1, 100_000)
        counters = net.counters()
        assert counters[0]["tx_bytes"] >= 100_000 and counters[1]["rx_bytes"] >= 100_000, counters
        assert probe["rtt_s"] < 0.001  # lan: no delay applied (under NO_DELAY_BELOW_S, tests/links.py)
    assert sleeper.wait(10) == -signal.SIGTERM  # killed with the namespaces
    after = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in after for n in names) and after == before


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="needs n"):
        Links(PROFILES["home"])
    with pytest.raises(ValueError, match="1 to 250"):
        Links(PROFILES["home"], n=251)
    assert issubclass(LinksUnavailable, RuntimeError)


def test_a_scaled_profile_keeps_the_share_of_time_spent_communicating():
    home = PROFILES["home"]
    scaled = home.scaled_for(our_params=1_000_000, our_step_s=0.1, real_params=1e9, real_step_s=3.0,
                             setting="x")
    # a message of c bytes per parameter: its time on the link over a step's time is the same for both models
    real_share = (1e9 / home.up_bps) / 3.0
    our_share = (1e6 / scaled.up_bps) / 0.1
    assert our_share == pytest.approx(real_share)
    assert scaled.rtt_s / 0.1 == pytest.approx(home.rtt_s / 3.0) and scaled.loss == home.loss
    assert scaled.stands_for == "x" and scaled.down_bps / scaled.up_bps == pytest.approx(5.0)
