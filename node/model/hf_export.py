"""One path of the DiPaCo model as a standard Hugging Face GPT-2: weights, config and a byte-level tokenizer.

A path (node/model/model.py) is GPT-2's architecture: learned positions, pre-LN blocks with biased attention and
MLP, exact GELU, a final LayerNorm and a bias-free readout. Two things differ, both muP multipliers (TP-V), and
both are linear, so they fold into the weights and `GPT2LMHeadModel` computes our forward with its stock code:

- the attention logits: ours are scaled by `CausalSelfAttention.scale` (1/d_head · sqrt(base d_head) under muP),
  GPT-2's by 1/sqrt(d_head): the query's weights and bias are multiplied by scale · sqrt(d_head);
- the readout: ours is multiplied by 1/width_mult: the readout matrix is, and GPT-2's head stays untied.

Tokens are raw UTF-8 bytes (id = byte value). The tokenizer is a merge-free BPE over GPT-2's byte-to-character
table, so `AutoTokenizer` gives exactly our ids for any text and decodes them back. `transformers` and `tokenizers`
are an optional extra (`pip install pathswarm[hf]`); this module imports them only inside the functions that
write files, so the conversion itself is testable without them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, cast

import torch

from pathswarm.node.model.model import Block, CausalSelfAttention, LevelModule, PathModel

BYTES = 256
HF_EXTRA_HINT = "pip install 'pathswarm[hf]'  (transformers and tokenizers)"


class ExportError(ValueError):
    """A path cannot be exported as asked; the message says why."""


def gpt2_config(model: PathModel) -> dict[str, Any]:
    """The `GPT2Config` arguments of a path: its shape, exact GELU, no dropout, an untied head."""
    cfg = model.spec.model
    if cfg.vocab_size < BYTES:
        raise ExportError(f"model.vocab_size is {cfg.vocab_size}: the byte tokenizer needs all {BYTES} byte values")
    return {
        "model_type": "gpt2", "vocab_size": cfg.vocab_size, "n_positions": cfg.context_len, "n_embd": cfg.width,
        "n_layer": len(model.levels) * cfg.layers_per_module, "n_head": cfg.n_heads,
        "n_inner": cfg.mlp_ratio * cfg.width,
        "activation_function": "gelu", "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "layer_norm_epsilon": _layer_norm_eps(model), "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False, "tie_word_embeddings": False,
        # No special tokens: every id is a byte. Generation stops at its length, never at an "end of text".
        "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
    }


def _layer_norm_eps(model: PathModel) -> float:
    eps = {m.eps for m in model.modules() if isinstance(m, torch.nn.LayerNorm)}
    if len(eps) != 1:
        raise ExportError(f"the path's LayerNorms use several epsilons {sorted(eps)}; GPT-2 takes one")
    return float(eps.pop())


def query_factor(attn: CausalSelfAttention) -> float:
    """What the query is multiplied by so that GPT-2's 1/sqrt(d_head) gives our attention scale."""
    return attn.scale * math.sqrt(attn.d_head)


@torch.no_grad()
def gpt2_state_dict(model: PathModel) -> dict[str, torch.Tensor]:
    """The path's weights under `GPT2LMHeadModel`'s names, the muP multipliers folded in. GPT-2's `Conv1D` stores
    (in, out): our `Linear` weights are transposed."""
    shared, width = model.shared, model.spec.model.width
    out: dict[str, torch.Tensor] = {
        "transformer.wte.weight": shared.tok_emb.weight, "transformer.wpe.weight": shared.pos_emb.weight,
        "transformer.ln_f.weight": shared.ln_f.weight, "transformer.ln_f.bias": shared.ln_f.bias,
        "lm_head.weight": shared.readout.weight * shared.readout_mult,
    }
    blocks = [cast(Block, block) for level in model.levels for block in cast(LevelModule, level).blocks]
    for i, block in enumerate(blocks):
        p = f"transformer.h.{i}."
        factor = query_factor(block.attn)
        qkv_w, qkv_b = block.attn.qkv.weight.clone(), block.attn.qkv.bias.clone()
        qkv_w[:width] *= factor  # rows 0..width are the query's (CausalSelfAttention splits q, k, v in that order)
        qkv_b[:width] *= factor
        out |= {
            p + "ln_1.weight": block.ln1.weight, p + "ln_1.bias": block.ln1.bias,
            p + "attn.c_attn.weight": qkv_w.t(), p + "attn.c_attn.bias": qkv_b,
            p + "attn.c_proj.weight": block.attn.proj.weight.t(), p + "attn.c_proj.bias": block.attn.proj.bias,
            p + "ln_2.weight": block.ln2.weight, p + "ln_2.bias": block.ln2.bias,
            p + "mlp.c_fc.weight": block.mlp.fc.weight.t(), p + "mlp.c_fc.bias": block.mlp.fc.bias,
            p + "mlp.c_proj.weight": block.mlp.proj.weight.t(), p + "mlp.c_proj.bias": block.mlp.proj.bias,
        }
    return {k: v.detach().float().contiguous().clone() for k, v in out.items()}


def byte_to_char() -> dict[int, str]:
    """GPT-2's reversible byte → printable character table (what the `ByteLevel` pre-tokenizer emits)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(BYTES):
        if b not in table:
            table[b] = chr(BYTES + extra)
            extra += 1
    return table


def byte_tokenizer():
    """A `PreTrainedTokenizerFast` whose ids are UTF-8 byte values: a BPE without merges over the byte table."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast
    except ImportError as e:
        raise ExportError(f"exporting to Hugging Face needs transformers and tokenizers ({e.name} is missing): "
                          f"{HF_EXTRA_HINT}") from None
    vocab = {char: byte for byte, char in byte_to_char().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    # No regex split and no prefix space: the text's bytes in order, one token each.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=None, clean_up_tokenization_spaces=False)


def write_hf_path(model: PathModel, out_dir: str | Path) -> Path:
    """Write the path as a `transformers` model directory (config.json, model.safetensors, the tokenizer's files,
    generation_config.json); returns it. The weights are loaded into `GPT2LMHeadModel` first: every key must land."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        raise ExportError(f"exporting to Hugging Face needs transformers ({e.name} is missing): "
                          f"{HF_EXTRA_HINT}") from None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = gpt2_config(model)
    config.pop("model_type")
    hf = GPT2LMHeadModel(GPT2Config(**config))
    missing, unexpected = hf.load_state_dict(gpt2_state_dict(model), strict=False)
    # GPT-2 may register its causal mask as a buffer: not a weight, and not ours to set.
    missing = [k for k in missing if not k.endswith((".attn.bias", ".attn.masked_bias"))]
    if missing or unexpected:
        raise ExportError(f"GPT-2's weights do not match the path's (missing {missing[:4]}, extra {unexpected[:4]})")
    hf.generation_config.do_sample = True  # a byte model greedy-decodes into loops; pathswarm generate samples too
    hf.generation_config.temperature = 0.8
    hf.eval()
    hf.save_pretrained(out, safe_serialization=True)
    byte_tokenizer().save_pretrained(out)
    return out
