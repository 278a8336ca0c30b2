"""The whole model on disk: assembling it from node checkpoints, eval and generate on it, and the one line that says
what to do when a prompt routes to a path a checkpoint does not hold."""

import pytest
import torch
from click.testing import CliRunner

from pathswarm.node.app.cli import main
from pathswarm.node.model.data import load_documents
from pathswarm.node.model.model import new_module
from pathswarm.node.model.router import route
from pathswarm.node.train.assemble import assemble, choose_state
from pathswarm.node.train.checkpoint import CheckpointError, ModuleState, load_checkpoint, save_checkpoint
from pathswarm.node.train.evaluate import generate_text, routed_eval
from pathswarm.node.train.model_dir import SPEC_FILE, resolve_spec, write_model
from pathswarm.protocol.spec import format_path

from ..conftest import tiny_spec


def module_state(spec, mid: str, round_: int, bump: float = 0.0) -> ModuleState:
    """A module at `round_`: its seed weights moved by `bump` (another version of the same round when it differs)."""
    weights = {k: v + bump + 0.01 * round_ for k, v in new_module(spec, mid).state_dict().items()}
    numel = sum(v.numel() for v in weights.values())
    return ModuleState(weights=weights, momentum=torch.full((numel,), 0.1 * round_), round=round_)


def node_checkpoint(spec, root, path, rounds, bumps=None):
    """A node's checkpoint root: its path's modules saved at each of `rounds` (the last two stay)."""
    for r in rounds:
        states = {mid: module_state(spec, mid, r, (bumps or {}).get((mid, r), 0.0)) for mid in spec.module_ids(path)}
        save_checkpoint(root, spec, r, states)
    return root


# ---- the choice rule ----------------------------------------------------------------------------------------
def test_choose_takes_the_newest_round_they_agree_on():
    assert choose_state({(3, "a"): ["n1", "n2"], (2, "b"): ["n1"]}) == ((3, "a"), [])
    # one checkpoint ahead of the others: its newer round is nobody's disagreement
    assert choose_state({(4, "c"): ["n3"], (3, "a"): ["n1", "n2"]})[0] == (4, "c")


def test_choose_takes_the_majority_version_of_a_split_round():
    state, notes = choose_state({(3, "a"): ["n1", "n2"], (3, "b"): ["n3"], (2, "z"): ["n1", "n2", "n3"]})
    assert state == (3, "a")
    assert "2 versions" in notes[0] and "2 of 3" in notes[0]


def test_choose_passes_over_a_split_round_without_majority():
    state, notes = choose_state({(3, "a"): ["n1"], (3, "b"): ["n2"], (2, "z"): ["n1", "n2"]})
    assert state == (2, "z")
    assert "passed over" in notes[0]
    assert choose_state({(3, "a"): ["n1"], (3, "b"): ["n2"]})[0] is None
    assert choose_state({}) == (None, [])


# ---- assemble ----------------------------------------------------------------------------------------------
def test_assemble_takes_every_module_from_the_nodes_checkpoints(tmp_path):
    spec = tiny_spec()
    a = node_checkpoint(spec, tmp_path / "a", (0, 0), [1, 2, 3])
    b = node_checkpoint(spec, tmp_path / "b", (1, 1), [1, 2])  # a round behind: shared comes from a's round 3
    c = node_checkpoint(spec, tmp_path / "c", (0, 1), [2, 3])
    modules, chosen, _ = assemble(spec, [a, b, c])
    assert set(modules) == set(spec.all_module_ids())
    by = {ch.module: ch for ch in chosen}
    assert {m: by[m].round for m in by} == {"shared": 3, "L0M0": 3, "L1M0": 3, "L0M1": 2, "L1M1": 3}
    assert set(by["shared"].held_by) == {str(a), str(c)}
    for mid, st in modules.items():  # bit for bit the state saved at that round
        want = module_state(spec, mid, by[mid].round)
        assert all(torch.equal(st.weights[k], want.weights[k]) for k in want.weights)
        assert torch.equal(st.momentum, want.momentum)
    round_dir = write_model(tmp_path / "model", spec, modules, {"kind": "assemble"})
    assert round_dir.name == "round-000003"
    assert resolve_spec(tmp_path / "model", None).swarm_id == spec.swarm_id  # the spec travels with the model
    assert resolve_spec(round_dir, None).swarm_id == spec.swarm_id
    back = load_checkpoint(tmp_path / "model", spec)
    assert {m: s.round for m, s in back.modules.items()} == {m: by[m].round for m in by}
    assert back.provenance == {"kind": "assemble"}


def test_assemble_passes_over_a_round_the_nodes_split(tmp_path):
    spec = tiny_spec()
    # a and c both hold shared at round 3, in two versions: no majority, so round 2, which they agree on
    a = node_checkpoint(spec, tmp_path / "a", (0, 0), [2, 3])
    c = node_checkpoint(spec, tmp_path / "c", (0, 1), [2, 3], bumps={("shared", 3): 0.5})
    b = node_checkpoint(spec, tmp_path / "b", (1, 1), [2])
    d = node_checkpoint(spec, tmp_path / "d", (1, 0), [2])
    _, chosen, _ = assemble(spec, [a, b, c, d])
    shared = next(ch for ch in chosen if ch.module == "shared")
    assert shared.round == 2 and "passed over" in shared.notes[0]


def test_assemble_names_the_modules_no_checkpoint_holds(tmp_path):
    spec = tiny_spec()
    a = node_checkpoint(spec, tmp_path / "a", (0, 0), [1])
    with pytest.raises(CheckpointError, match=r"L0M1 \(paths 1\.0, 1\.1\): no checkpoint holds it"):
        assemble(spec, [a])
    other = tiny_spec(width=64, base_width=32)  # another swarm's checkpoint is refused, not mixed in
    with pytest.raises(CheckpointError, match="spec's swarm id"):
        assemble(other, [a])


def test_assemble_reads_a_state_from_another_checkpoint_when_one_is_damaged(tmp_path):
    spec = tiny_spec()
    a = node_checkpoint(spec, tmp_path / "a", (0, 0), [2])
    b = node_checkpoint(spec, tmp_path / "b", (0, 1), [2])
    c = node_checkpoint(spec, tmp_path / "c", (1, 0), [2])
    (a / "round-000002" / "shared.safetensors").write_bytes(b"damaged")
    _, chosen, _ = assemble(spec, [a, b, c])
    shared = next(ch for ch in chosen if ch.module == "shared")
    assert shared.source == b / "round-000002"


# ---- eval and generate on a whole model, and on one path --------------------------------------------------
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    spec = tiny_spec()
    d = tmp_path_factory.mktemp("whole") / "model"
    write_model(d, spec, {mid: module_state(spec, mid, 1) for mid in spec.all_module_ids()}, {"kind": "test"})
    return d


def prompts_by_path(spec):
    out = {}
    for doc in load_documents(spec.data):
        out.setdefault(format_path(spec.path_of_index(route(doc.text, spec.router))), doc.text[:60])
    return out


def test_generate_routes_each_prompt_of_a_whole_model_to_its_path(model_dir):
    spec = resolve_spec(model_dir, None)
    prompts = prompts_by_path(spec)
    assert len(prompts) == spec.n_paths
    for path, prompt in prompts.items():
        got, text = generate_text(spec, str(model_dir), prompt, 8, temperature=0.0)
        assert got == path and len(text) > 0


def test_generate_on_one_path_names_the_path_and_what_to_do(tmp_path):
    spec = tiny_spec()
    ckpt = node_checkpoint(spec, tmp_path / "node", (0, 0), [1])
    prompt = prompts_by_path(spec)["1.1"]
    with pytest.raises(CheckpointError) as e:
        generate_text(spec, str(ckpt), prompt, 8)
    msg = str(e.value)
    assert "routes to path 1.1" in msg and "holds path 0.0" in msg and "model pull" in msg and "\n" not in msg


def test_eval_of_a_whole_model_covers_every_path(model_dir):
    spec = resolve_spec(model_dir, None)
    rows, overall = routed_eval(spec, load_checkpoint(model_dir, spec), max_batches=2)
    assert [r.path for r in rows] == [format_path(p) for p in spec.paths()]
    assert overall.tokens == sum(r.tokens for r in rows) > 0


def test_cli_eval_and_generate_need_no_spec_for_a_whole_model(model_dir, tmp_path):
    runner = CliRunner()
    got = runner.invoke(main, ["eval", "--checkpoint", str(model_dir), "--batches", "1"])
    assert got.exit_code == 0, got.output
    assert "all paths" in got.output
    got = runner.invoke(main, ["generate", "--checkpoint", str(model_dir), "--prompt", "The", "--max-bytes", "4"])
    assert got.exit_code == 0 and got.output.startswith("[path "), got.output
    # a node's checkpoint has no spec: one line that says to pass one
    spec = tiny_spec()
    node = node_checkpoint(spec, tmp_path / "node", (0, 0), [1])
    got = runner.invoke(main, ["eval", "--checkpoint", str(node)])
    assert got.exit_code == 2 and f"holds no {SPEC_FILE}" in got.output and "--spec" in got.output


def test_cli_assemble_writes_a_model_eval_reads(tmp_path):
    spec = tiny_spec()
    spec_file = tmp_path / "swarm.toml"
    spec_file.write_text(spec.to_toml())
    roots = [str(node_checkpoint(spec, tmp_path / f"n{i}", p, [1, 2])) for i, p in enumerate(spec.paths())]
    runner = CliRunner()
    got = runner.invoke(main, ["model", "assemble", *roots, "--spec", str(spec_file), "-o", str(tmp_path / "m")])
    assert got.exit_code == 0, got.output
    assert "generate --checkpoint" in got.output
    assert (tmp_path / "m" / SPEC_FILE).is_file()
    back = load_checkpoint(tmp_path / "m", spec)
    assert back.provenance["kind"] == "assemble" and set(back.provenance["modules"]) == set(spec.all_module_ids())
    got = runner.invoke(main, ["model", "assemble", roots[0], "--spec", str(spec_file), "-o", str(tmp_path / "x")])
    assert got.exit_code == 2 and "cannot assemble a whole model" in got.output
