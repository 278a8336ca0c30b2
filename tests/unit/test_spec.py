"""Swarm spec: canonical id, TOML round trip, and one clear error (exit 2) for every kind of bad spec."""

import pytest
from click.testing import CliRunner

from pathswarm.node.app.cli import main
from pathswarm.protocol.spec import (
    RouterSpec,
    SpecError,
    SwarmSpec,
    format_path,
    load_spec,
    loads_spec,
    parse_path,
)

CENTROIDS = "centroids = [[0.5, 0.25], [0.0, 1.0], [1.0, 0.0], [0.125, 0.75]]"

GOOD = f"""
levels = [2, 2]
name = "t"
[model]
width = 64
n_heads = 4
[router]
features = 2
{CENTROIDS}
"""

# Same values, other key order, other formatting, comments.
REORDERED = f"""
# a comment
[router]
{CENTROIDS}
features   =   2

[model]
n_heads = 4
width = 0x40

[outer]
lr = 0.7

[data]
corpus = 'bbc'
"""
REORDERED = 'name = "t"\nlevels = [ 2,\n 2 ]\n' + REORDERED


def test_swarm_id_ignores_order_and_formatting_but_not_values():
    a, b = loads_spec(GOOD), loads_spec(REORDERED)
    assert a == b
    assert a.swarm_id == b.swarm_id
    assert len(a.swarm_id) == 64
    changed = loads_spec(GOOD.replace("width = 64", "width = 128"))
    assert changed.swarm_id != a.swarm_id
    renamed = loads_spec(GOOD.replace('name = "t"', 'name = "u"'))
    assert renamed.swarm_id != a.swarm_id


def test_toml_round_trip_keeps_the_id(tmp_path):
    spec = loads_spec(GOOD).replace(router=RouterSpec(features=2, centroids=((0.1, 1 / 3),) * 4))
    path = tmp_path / "s.toml"
    path.write_text(spec.to_toml())
    again = load_spec(path)
    assert again == spec
    assert again.swarm_id == spec.swarm_id


def test_the_creation_time_bounds_rounds_and_leaves_older_ids_alone(tmp_path):
    old = loads_spec(GOOD)
    # Not stated: left out of the canonical form (the id's input), so the id is what it was before the field.
    assert old.created == 0 and '"created"' not in old.canonical_json() and old.round_limit(2e9) is None
    dated = loads_spec('created = 1700000000\n' + GOOD)
    assert dated.swarm_id != old.swarm_id  # the time is part of what peers agree on
    path = tmp_path / "s.toml"
    path.write_text(dated.to_toml())
    assert load_spec(path).swarm_id == dated.swarm_id
    # (age + 1 h of clock slack) × 20 rounds a second; never below the slack's worth
    assert dated.round_limit(1700000000 + 86400) == (86400 + 3600) * 20
    assert dated.round_limit(1700000000 - 10**6) == 3600 * 20
    with pytest.raises(SpecError, match="created"):
        loads_spec("created = -1\n" + GOOD)


def test_eager_updates_are_stated_only_when_on(tmp_path):
    old = loads_spec(GOOD)
    # off, the default: left out of the canonical form, so every id from before the field stays what it was
    assert old.outer.eager is False and '"eager"' not in old.canonical_json()
    eager = loads_spec(GOOD + "\n[outer]\neager = true\nlr = 0.35\n")
    assert eager.outer.eager and eager.swarm_id != loads_spec(GOOD + "\n[outer]\nlr = 0.35\n").swarm_id
    path = tmp_path / "s.toml"
    path.write_text(eager.to_toml())
    assert load_spec(path) == eager and load_spec(path).swarm_id == eager.swarm_id
    with pytest.raises(SpecError, match="outer.eager"):
        loads_spec(GOOD + '\n[outer]\neager = true\nkind = "sparseloco"\n[codec]\nfeedback = "buffer"\n')


def test_paths_and_modules():
    spec = SwarmSpec(levels=(3, 2))
    assert spec.n_paths == 6
    assert spec.paths()[:3] == [(0, 0), (0, 1), (1, 0)]
    assert all(spec.index_of_path(p) == i for i, p in enumerate(spec.paths()))
    assert spec.module_ids((2, 1)) == ["shared", "L0M2", "L1M1"]
    assert spec.all_module_ids() == ["shared", "L0M0", "L0M1", "L0M2", "L1M0", "L1M1"]
    assert parse_path("2.1", spec) == (2, 1)
    assert format_path((2, 1)) == "2.1"
    with pytest.raises(ValueError, match="does not fit"):
        parse_path("3.0", spec)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (GOOD + "\n[codec]\nblock = 3\n", "codec.block"),  # unknown key
        (GOOD + "\nbogus = 1\n", "bogus"),
        (GOOD.replace("width = 64", 'width = "wide"'), "model.width"),  # wrong type
        (GOOD.replace("width = 64", "width = 64.0"), "model.width"),
        (GOOD + "\n[inner]\nsteps = 0\n", "inner.steps"),  # non-positive
        (GOOD.replace("levels = [2, 2]", "levels = [2, 0]"), "levels[1]"),
        (GOOD.replace("n_heads = 4", "n_heads = 5"), "model.width"),  # not divisible by heads
        (GOOD.replace(CENTROIDS, ""), "router.centroids"),  # missing router
        (GOOD.replace("[router]", "[unused]").replace("features = 2", "").replace(CENTROIDS, ""), "router"),
        (GOOD.replace("centroids = [[0.5, 0.25], ", "centroids = ["), "router.centroids"),  # 3 for 4 paths
        (GOOD + "\n[outer]\nmomentum = 1.5\n", "outer.momentum"),
        (GOOD + "\n[data]\ncorpus = 'dir'\n", "data.path"),
        ("levels = [2, 2\n", "not valid TOML"),
    ],
)
def test_bad_spec_names_the_key(text, key):
    with pytest.raises(SpecError) as err:
        loads_spec(text)
    assert key in str(err.value)


def test_cli_bad_spec_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(GOOD.replace("n_heads = 4", "n_heads = 3"))
    result = CliRunner().invoke(main, ["swarm", "id", str(bad)])
    assert result.exit_code == 2
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "model.width" in lines[0] and "Traceback" not in result.output


def test_cli_missing_spec_file(tmp_path):
    result = CliRunner().invoke(main, ["swarm", "id", str(tmp_path / "nope.toml")])
    assert result.exit_code == 2
    assert "not found" in result.output


def test_cli_swarm_id_prints_id(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(GOOD)
    result = CliRunner().invoke(main, ["swarm", "id", str(path)])
    assert result.exit_code == 0
    assert result.output.strip() == loads_spec(GOOD).swarm_id


def test_counts_read_as_english():
    from pathswarm.node.app.fmt import count

    assert (count(1, "round"), count(0, "round"), count(3, "path"), count(1234, "node")) == (
        "1 round", "0 rounds", "3 paths", "1,234 nodes")
