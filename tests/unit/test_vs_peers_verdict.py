"""benchmarks/vs_peers.py's verdict: when pathswarm reached each baseline's final loss, and which pathswarm arm that
was (pure: curves given)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.append(str(BENCHMARKS))  # the benchmarks import each other by bare name

import vs_peers  # noqa: E402


def curve(*points: tuple[float, float]) -> list[dict]:
    return [{"t": t, "val_loss": v} for t, v in points]


DDP = {"curve": curve((0, 5.0), (100, 2.0), (200, 1.8))}  # its final 1.8, reached at 200 s


def test_lan_ratio_uses_the_int8_arm_and_names_it():
    arms = {"pathswarm int8": {"curve": curve((0, 5.0), (120, 1.9), (230, 1.79))},
            "pathswarm int8 one-reducer": {"curve": curve((0, 5.0), (150, 1.7))}, "ddp": DDP}
    got = vs_peers.verdict(arms, "lan")["ddp"]
    assert got["pathswarm_arm"] == "pathswarm int8"
    assert got["their_time_s"] == 200 and got["pathswarm_time_s"] == 230  # stepwise: the first round at or below
    assert abs(got["pathswarm_over_ddp"] - 1.15) < 1e-9 and got["met"] is True


def test_a_variant_run_alone_is_the_one_judged():
    arms = {"pathswarm int8 one-reducer": {"curve": curve((0, 5.0), (200, 1.9), (260, 1.85))}, "ddp": DDP}
    got = vs_peers.verdict(arms, "lan")["ddp"]
    assert got["pathswarm_arm"] == "pathswarm int8 one-reducer"
    assert got["pathswarm_time_s"] is None and got["met"] is False  # never reached 1.8


def test_home_goals_are_ratios_of_times():
    arms = {"pathswarm int8": {"curve": curve((0, 5.0), (20, 3.0), (60, 2.2))},
            "hivemind local": {"curve": curve((0, 5.0), (100, 2.5), (120, 2.4))}}
    got = vs_peers.verdict(arms, "home")["hivemind local"]
    assert got["their_time_s"] == 120 and got["pathswarm_time_s"] == 60
    assert got["sooner"] == 2.0 and got["goal_sooner"] == 2.0 and got["met"] is True
