"""A path exported to Hugging Face: `transformers` loads it with its stock classes, its logits equal ours, its
validation loss equals ours to 4 digits, its tokenizer gives our byte ids, and `pipeline("text-generation")` runs.

Needs the optional extra (`pip install 'pathswarm[hf]'`); `make install` installs it, so these run in CI."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from pathswarm.node.app.cli import main
from pathswarm.node.app.hf_model import export_hf
from pathswarm.node.model.data import TokenSampler, load_documents, split
from pathswarm.node.model.hf_export import byte_to_char, gpt2_config, query_factor
from pathswarm.node.model.model import build_path, new_module
from pathswarm.node.model.router import documents_by_path
from pathswarm.node.train.checkpoint import ModuleState, load_checkpoint
from pathswarm.node.train.evaluate import model_from_checkpoint
from pathswarm.node.train.inner import evaluate_loss
from pathswarm.node.train.model_dir import write_model
from pathswarm.protocol.spec import load_spec

from ..conftest import tiny_spec

transformers = pytest.importorskip("transformers", reason="the Hugging Face export needs pip install 'pathswarm[hf]'")

PATH = (1, 0)


@pytest.fixture(scope="module")
def trained_model(tmp_path_factory):
    """A whole model of a muP spec at width_mult 2 (both multipliers differ from 1), weights moved off their init."""
    spec = tiny_spec(width=64, base_width=32, n_heads=4)
    gen = torch.Generator().manual_seed(0)
    modules = {}
    for mid in spec.all_module_ids():
        seed = new_module(spec, mid).state_dict()
        weights = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in seed.items()}
        numel = sum(v.numel() for v in weights.values())
        modules[mid] = ModuleState(weights, torch.zeros(numel), round=3)
    d = tmp_path_factory.mktemp("hf") / "model"
    write_model(d, spec, modules, {"kind": "test", "tokens_trained": 12345})
    return spec, d


@pytest.fixture(scope="module")
def exported(trained_model, tmp_path_factory):
    spec, d = trained_model
    out = tmp_path_factory.mktemp("hf") / "export"
    written = export_hf(spec, load_checkpoint(d, spec), out, path="1.0", eval_batches=2)
    return written, out


def routed_batches(spec, max_batches=2):
    _, val = split(load_documents(spec.data), spec.data.val_fraction)
    mine = documents_by_path(spec, val)[PATH]
    return list(TokenSampler(mine, spec.model.context_len, seed=0).eval_batches(spec.inner.batch_size, max_batches))


def test_the_conversion_folds_both_mup_multipliers():
    spec = tiny_spec(width=64, base_width=32, n_heads=4)
    model = build_path(spec, PATH)
    cfg = gpt2_config(model)
    assert (cfg["n_layer"], cfg["n_embd"], cfg["n_inner"], cfg["tie_word_embeddings"]) == (2, 64, 256, False)
    attn = model.levels[0].blocks[0].attn
    # muP's 1/d_head (times sqrt(base d_head)) against GPT-2's 1/sqrt(d_head): sqrt(1 / width_mult) here
    assert query_factor(attn) == pytest.approx(math.sqrt(0.5))
    assert model.shared.readout_mult == pytest.approx(0.5)
    assert sorted(byte_to_char()) == list(range(256)) and len(set(byte_to_char().values())) == 256


def test_exported_logits_and_loss_equal_ours(trained_model, exported):
    spec, d = trained_model
    _, out = exported
    ours = model_from_checkpoint(spec, load_checkpoint(d, spec), PATH)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out)
    hf.eval()
    assert type(hf).__name__ == "GPT2LMHeadModel"
    batches = routed_batches(spec)
    worst, hf_total, n = 0.0, 0.0, 0
    with torch.no_grad():
        for x, y in batches:
            a, b = ours(x), hf(x).logits
            worst = max(worst, (a - b).abs().max().item())
            hf_total += F.cross_entropy(b.reshape(-1, b.shape[-1]), y.reshape(-1), reduction="sum").item()
            n += y.numel()
    assert worst <= 1e-5
    our_loss, our_n = evaluate_loss(ours, batches)
    assert our_n == n
    assert round(hf_total / n, 4) == round(our_loss, 4)


def test_the_tokenizer_gives_our_byte_ids_and_the_pipeline_runs(exported):
    _, out = exported
    tok = transformers.AutoTokenizer.from_pretrained(out)
    text = "Goal! Zürich — 3:1 ☺\n"
    ids = tok(text)["input_ids"]
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    gen = transformers.pipeline("text-generation", model=str(out), tokenizer=tok)
    got = gen("The match", max_new_tokens=12, do_sample=False)[0]["generated_text"]
    assert got.startswith("The match") and len(got.encode()) > len("The match")


def test_the_card_spec_and_router_travel_with_the_path(trained_model, exported):
    spec, _ = trained_model
    written, out = exported
    assert [(p, d) for p, d, _ in written] == [("1.0", out)]
    card = (out / "README.md").read_text()
    assert spec.swarm_id in card and "path 1.0" in card and "12,345" in card
    assert f"{written[0][2].loss:.4f}" in card
    assert load_spec(out / "spec.toml").swarm_id == spec.swarm_id
    router = json.loads((out / "router.json").read_text())
    assert router["paths"] == ["0.0", "0.1", "1.0", "1.1"] and len(router["centroids"]) == 4


def test_cli_export_of_every_path(trained_model, tmp_path):
    _, d = trained_model
    got = CliRunner().invoke(main, ["model", "export", str(d), "--hf", str(tmp_path / "hf"), "--eval-batches", "1"])
    assert got.exit_code == 0, got.output
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["path-0.0", "path-0.1", "path-1.0", "path-1.1"]
    assert (tmp_path / "hf" / "path-0.1" / "model.safetensors").is_file()
    got = CliRunner().invoke(main, ["model", "export", str(d), "--hf", str(tmp_path / "x"), "--path", "7.0"])
    assert got.exit_code == 2 and "error:" in got.output
