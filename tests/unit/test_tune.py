"""The learning-rate sweep: selection rules on hand-made trials, writing the choice into a spec, the command."""

import dataclasses
import math

import pytest
from click.testing import CliRunner

from pathswarm.node.app.cli_tune import tune_command
from pathswarm.node.train.tune import (
    SweepConfig,
    Trial,
    best_lr_per_width,
    choose_lr,
    fitted_log2_optimum,
    grid_shift,
    lr_grid,
    mean_losses,
    proxy_spec,
    sweep_report,
    with_inner_lr,
)
from pathswarm.protocol.spec import load_spec


def trials_from(table: dict[int, dict[float, float | list[float]]]) -> list[Trial]:
    out = []
    for width, by_lr in table.items():
        for lr, losses in by_lr.items():
            for seed, loss in enumerate(losses if isinstance(losses, list) else [losses]):
                out.append(Trial(width, lr, seed, "mup", loss, loss, 0.0))
    return out


def test_lr_grid_is_factors_of_two_around_the_centre():
    assert lr_grid(1e-3, 3) == pytest.approx((5e-4, 1e-3, 2e-3))
    assert lr_grid(1.0, 4) == pytest.approx((0.25, 0.5, 1.0, 2.0))
    with pytest.raises(ValueError):
        lr_grid(1e-3, 0)


def test_best_lr_per_width_averages_seeds_and_skips_diverged_runs():
    trials = trials_from({
        64: {0.5: [3.0, 3.0], 1.0: [2.0, 2.4], 2.0: [2.1, 2.1]},   # means 3.0, 2.2, 2.1 → 2.0
        128: {0.5: [2.5, 2.5], 1.0: [2.0, 2.0], 2.0: [1.0, math.inf]},  # 2.0 diverged for one seed → 1.0
    })
    assert mean_losses(trials)[128][2.0] == math.inf
    assert mean_losses(trials)[64][1.0] == pytest.approx(2.2)
    assert best_lr_per_width(trials) == {64: 2.0, 128: 1.0}
    assert grid_shift(best_lr_per_width(trials), [0.5, 1.0, 2.0]) == 1


def test_a_tie_goes_to_the_smaller_lr():
    assert best_lr_per_width(trials_from({64: {1.0: 2.0, 2.0: 2.0, 4.0: 2.5}})) == {64: 1.0}


def test_fitted_optimum_finds_a_parabola_vertex_between_grid_points():
    exact = {2.0 ** e: 1.0 + 0.05 * (e + 7.3) ** 2 for e in range(-11, -3)}
    assert fitted_log2_optimum(exact) == pytest.approx(-7.3)
    # A flat bottom with a noisy bump: the argmin (2^-6) sits at the edge, the vertex stays in the middle.
    bumpy = {2.0 ** -9: 1.89, 2.0 ** -8: 1.8755, 2.0 ** -7: 1.91, 2.0 ** -6: 1.8754, 2.0 ** -5: 1.98,
             2.0 ** -3: math.inf}
    assert -8.2 < fitted_log2_optimum(bumpy) < -7.0
    assert fitted_log2_optimum({1.0: 2.0, 2.0: 1.0}) == 1.0  # too few points: the argmin


def test_choose_lr_pools_widths_by_excess_loss():
    # Best per width: 64 → 4.0, 128 → 1.0; excess over widths: lr 1 → (0.3 + 0)/2, lr 2 → (0.1 + 0.1)/2,
    # lr 4 → (0 + 1.0)/2: the pooled choice is 2.0 although it is best at no single width.
    trials = trials_from({64: {1.0: 3.3, 2.0: 3.1, 4.0: 3.0}, 128: {1.0: 2.0, 2.0: 2.1, 4.0: 3.0}})
    assert choose_lr(trials) == 2.0
    assert grid_shift(best_lr_per_width(trials), [1.0, 2.0, 4.0]) == 2
    report = sweep_report(trials)
    assert report["chosen_lr"] == 2.0 and report["shift_grid_steps"] == 2
    assert report["val_loss"]["64"] == [3.3, 3.1, 3.0]


def test_an_lr_that_diverged_at_any_width_is_never_chosen():
    trials = trials_from({64: {1.0: 3.0, 2.0: 2.0}, 128: {1.0: 2.0, 2.0: math.inf}})
    assert choose_lr(trials) == 1.0
    assert sweep_report(trials)["val_loss"]["128"] == [2.0, None]  # JSON has no infinity
    with pytest.raises(ValueError, match="diverged"):
        choose_lr(trials_from({64: {1.0: math.inf}}))


def test_config_and_proxy_are_checked(spec):
    with pytest.raises(ValueError, match="lrs"):
        SweepConfig(lrs=())
    with pytest.raises(ValueError, match="parametrization"):
        SweepConfig(lrs=(1e-3,), parametrization="ntk")
    proxy = proxy_spec(spec, 16, "sp", seed_offset=3)
    assert (proxy.model.width, proxy.model.parametrization, proxy.model.seed) == (16, "sp", spec.model.seed + 3)
    assert proxy.model.base_width == spec.model.base_width
    with pytest.raises(ValueError, match="divisible"):
        proxy_spec(spec, 15)


def test_writing_the_lr_keeps_every_other_field(spec, tmp_path):
    path = tmp_path / "swarm.toml"
    path.write_text(with_inner_lr(spec, 0.00123).to_toml())
    loaded = load_spec(path)
    assert loaded.inner.lr == 0.00123
    assert dataclasses.replace(loaded.inner, lr=spec.inner.lr) == spec.inner
    assert loaded.replace(inner=spec.inner) == spec
    assert loaded.swarm_id != spec.swarm_id


def test_tune_command_sweeps_and_writes_the_spec(spec, tmp_path):
    spec = with_inner_lr(spec, 1e-3)
    path = tmp_path / "swarm.toml"
    path.write_text(spec.to_toml())
    out = tmp_path / "tune.json"
    res = CliRunner().invoke(tune_command, ["--spec", str(path), "--widths", "16,32", "--lrs", "1e-3,4e-3",
                                            "--steps", "3", "--eval-batches", "1", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "chosen inner lr" in res.output and "width 16" in res.output
    loaded = load_spec(path)
    assert loaded.inner.lr in (1e-3, 4e-3)
    assert loaded.replace(inner=spec.inner) == spec
    assert out.exists()
    bad = CliRunner().invoke(tune_command, ["--spec", str(tmp_path / "missing.toml")])
    assert bad.exit_code == 2 and "not found" in bad.output
