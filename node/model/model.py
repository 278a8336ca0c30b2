"""The DiPaCo modular causal transformer, muP-parametrised (arXiv 2403.10616, 2203.03466).

A swarm's model is `levels = [K0, K1, …]` modules per level plus one `shared` module (token and
position embeddings, final norm, readout) that every path holds. A *path* takes one module per level;
`build_path(spec, path)` composes it into a complete causal LM whose forward maps byte tokens to
logits. Module weights are addressable by module id (`shared`, `L0M1`, …) so a node saves, sends and
loads exactly the modules of its path. Every module is initialised from its own seed stream
(spec seed × module id), so any two peers build bit-identical initial weights for the same module.

muP (Tensor Programs V, Table 3, Adam variant), relative to `base_width`, with m = width/base_width:
- hidden matrices (attention and MLP): init std = init_std / sqrt(m), Adam lr = lr / m;
- embeddings, norms and biases (vector-like): init and lr independent of width;
- readout: output multiplied by 1/m (so its Adam lr stays constant), init N(0, init_std) like SP;
- attention logits scaled by 1/d_head (times sqrt of the base head size, so base width is unchanged).
Standard parametrisation ('sp') uses init_std and lr everywhere and 1/sqrt(d_head): it is kept for
the coordinate check and the muP-transfer benchmark.

Reads top to bottom: attention → MLP → block → level module → shared module → path → helpers.
"""

from __future__ import annotations

import hashlib
import math
from typing import cast

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

from pathswarm.protocol.spec import ModelSpec, SwarmSpec

SHARED = "shared"


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelSpec):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.d_head = cfg.width // cfg.n_heads
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.width)
        if cfg.parametrization == "mup":
            # 1/d_head instead of 1/sqrt(d_head): q·k grows like d_head once q and k correlate
            # during training. The base head size keeps the scale unchanged at base_width.
            base_d_head = cfg.base_width / cfg.n_heads
            self.scale = math.sqrt(base_d_head) / self.d_head
        else:
            self.scale = 1.0 / math.sqrt(self.d_head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_heads, self.d_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg: ModelSpec):
        super().__init__()
        self.fc = nn.Linear(cfg.width, cfg.mlp_ratio * cfg.width)
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.width, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """Pre-LN transformer block."""

    def __init__(self, cfg: ModelSpec):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.width)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.width)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class LevelModule(nn.Module):
    """One module of one level: a stack of blocks."""

    def __init__(self, cfg: ModelSpec):
        super().__init__()
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers_per_module))
        self.checkpointing = False
        """Activation checkpointing: keep only each block's input for the backward pass and recompute the rest
        (node/train/memory.py turns it on when a path does not fit otherwise; the same gradients, more compute)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            if self.checkpointing and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return x


class SharedModule(nn.Module):
    """Embeddings, final norm and readout: held by every path."""

    def __init__(self, cfg: ModelSpec):
        super().__init__()
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.width)
        self.pos_emb = nn.Embedding(cfg.context_len, cfg.width)
        self.ln_f = nn.LayerNorm(cfg.width)
        self.readout = nn.Linear(cfg.width, cfg.vocab_size, bias=False)
        # muP: the readout's output is divided by the width multiplier.
        self.readout_mult = 1.0 / cfg.width_mult if cfg.parametrization == "mup" else 1.0

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        return self.tok_emb(idx) + self.pos_emb(pos)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.readout(self.ln_f(x)) * self.readout_mult


class PathModel(nn.Module):
    """A complete causal LM: shared embedding → one module per level → shared readout."""

    def __init__(self, spec: SwarmSpec, path: tuple[int, ...], modules: dict[str, nn.Module]):
        super().__init__()
        spec.check_path(path)
        self.spec = spec
        self.path = tuple(path)
        self.module_ids = spec.module_ids(self.path)
        self.shared = cast(SharedModule, modules[SHARED])  # new_module(spec, SHARED) made it
        self.levels = nn.ModuleList(modules[mid] for mid in self.module_ids[1:])

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        if idx.shape[1] > self.spec.model.context_len:
            raise ValueError(f"sequence of {idx.shape[1]} tokens exceeds context_len {self.spec.model.context_len}")
        x = self.shared.embed(idx)
        for module in self.levels:
            x = module(x)
        logits = self.shared.logits(x)
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def set_checkpointing(self, on: bool) -> None:
        """Activation checkpointing for every block of the path (see LevelModule)."""
        for module in self.levels:
            cast(LevelModule, module).checkpointing = on

    def module(self, mid: str) -> nn.Module:
        if mid == SHARED:
            return self.shared
        try:
            return self.levels[self.module_ids.index(mid) - 1]
        except ValueError:
            raise KeyError(f"module {mid} is not on path {self.path}") from None

    def named_modules_of_path(self) -> dict[str, nn.Module]:
        return {mid: self.module(mid) for mid in self.module_ids}

    def module_state(self, mid: str) -> dict[str, torch.Tensor]:
        """The module's weights by parameter name (detached copies)."""
        return {k: v.detach().clone() for k, v in self.module(mid).state_dict().items()}

    def load_module_state(self, mid: str, state: dict[str, torch.Tensor]) -> None:
        module = self.module(mid)
        expected = module.state_dict()
        if set(state) != set(expected):
            missing, extra = set(expected) - set(state), set(state) - set(expected)
            raise ValueError(f"module {mid}: state keys differ (missing {sorted(missing)}, extra {sorted(extra)})")
        for k, v in state.items():
            if tuple(v.shape) != tuple(expected[k].shape):
                raise ValueError(f"module {mid}: {k} has shape {tuple(v.shape)}, expected {tuple(expected[k].shape)}")
        module.load_state_dict(state)

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        for _ in range(max_new_tokens):
            ctx = idx[:, -self.spec.model.context_len:]
            logits = self(ctx)[:, -1, :]
            if temperature <= 0:
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                probs = F.softmax(logits / temperature, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
        return idx


# ---- construction and initialisation -----------------------------------------------------------
def module_seed(spec: SwarmSpec, mid: str) -> int:
    """Seed of a module's init stream: every peer derives the same one from the spec."""
    digest = hashlib.sha256(f"{spec.model.seed}:{mid}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def is_hidden_matrix(module_id: str, name: str, param: torch.Tensor) -> bool:
    """Matrices whose both dimensions grow with width: muP scales their init and Adam lr."""
    return module_id != SHARED and param.ndim == 2


def new_module(spec: SwarmSpec, mid: str) -> nn.Module:
    """A freshly initialised module, identical on every peer for the same spec and id."""
    cfg = spec.model
    module = SharedModule(cfg) if mid == SHARED else LevelModule(cfg)
    if mid not in spec.all_module_ids():
        raise KeyError(f"module id {mid!r} is not in this swarm (modules: {spec.all_module_ids()})")
    gen = torch.Generator().manual_seed(module_seed(spec, mid))
    hidden_std = cfg.init_std / math.sqrt(cfg.width_mult) if cfg.parametrization == "mup" else cfg.init_std
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            if name.endswith("bias"):
                p.zero_()
            elif p.ndim == 1:  # LayerNorm gains
                p.fill_(1.0)
            elif is_hidden_matrix(mid, name, p):
                p.normal_(0.0, hidden_std, generator=gen)
                if name.endswith("proj.weight"):
                    # GPT-2's residual scaling: keeps the residual stream's scale independent of depth.
                    p.mul_(1.0 / math.sqrt(2 * cfg.layers_per_module * len(spec.levels)))
            else:
                # Embeddings and the readout: width-independent N(0, init_std). muP allows a zero readout
                # (TP-V, Table 3) but under DiLoCo it cost 19 % of final loss (benchmarks/diloco_vs_sync.py,
                # issue 16): with every logit at 0 the first rounds' outer gradients are dominated by the readout
                # and the cold outer Nesterov momentum re-applies them for many rounds. A random readout, times
                # the 1/m output multiplier, is still muP: logits are O(1/sqrt(m)) at init and vanish with width.
                p.normal_(0.0, cfg.init_std, generator=gen)
    return module


def build_path(spec: SwarmSpec, path: tuple[int, ...]) -> PathModel:
    """Compose the complete model of one path from freshly initialised modules."""
    spec.check_path(path)
    modules = {mid: new_module(spec, mid) for mid in spec.module_ids(tuple(path))}
    return PathModel(spec, tuple(path), modules)


def count_module_params(spec: SwarmSpec) -> dict[str, int]:
    """Parameter count of every module of the swarm (module id → count)."""
    cfg = spec.model
    counts = {SHARED: sum(p.numel() for p in SharedModule(cfg).parameters())}
    level_count = sum(p.numel() for p in LevelModule(cfg).parameters())
    for mid in spec.all_module_ids()[1:]:
        counts[mid] = level_count
    return counts


def path_param_count(spec: SwarmSpec) -> int:
    counts = count_module_params(spec)
    return counts[SHARED] + sum(counts[mid] for mid in spec.module_ids(spec.path_of_index(0))[1:])


def unflatten_like(template: dict[str, torch.Tensor], flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """A flat vector (a module's parameters in order, as peers exchange them) → tensors named and shaped as in
    `template` (a module's state_dict), each a copy."""
    out, offset = {}, 0
    for name, t in template.items():
        out[name] = flat[offset:offset + t.numel()].view_as(t).clone()
        offset += t.numel()
    return out


def param_groups(model: PathModel, lr: float, weight_decay: float) -> list[dict]:
    """AdamW parameter groups of a path with muP learning rates (see `module_param_groups`)."""
    return module_param_groups(model.spec, model.named_modules_of_path(), lr, weight_decay)


def module_param_groups(spec: SwarmSpec, modules: dict[str, nn.Module], lr: float, weight_decay: float) -> list[dict]:
    """AdamW parameter groups over modules by id, with muP learning rates: hidden matrices get lr / width_mult.

    Weight decay applies to matrices only (not norms, biases or embeddings)."""
    cfg = spec.model
    hidden_lr = lr / cfg.width_mult if cfg.parametrization == "mup" else lr
    groups: dict[tuple[float, float], list[torch.nn.Parameter]] = {}
    for mid, module in modules.items():
        for name, p in module.named_parameters():
            hidden = is_hidden_matrix(mid, name, p)
            key = (hidden_lr if hidden else lr, weight_decay if (p.ndim == 2 and "emb" not in name) else 0.0)
            groups.setdefault(key, []).append(p)
    return [{"params": ps, "lr": g_lr, "base_lr": g_lr, "weight_decay": wd} for (g_lr, wd), ps in groups.items()]
