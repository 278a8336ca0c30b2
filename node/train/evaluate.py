"""Inference on a checkpoint: routed validation loss per path, and generation from a routed prompt.

A document is always scored (and a prompt always continued) by the path the swarm's router picks
for it, exactly as at training time. Loss is next-byte cross-entropy in nats; bits per byte is
loss / ln 2 because tokens are bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from pathswarm.node.model.data import Document, TokenSampler, decode_tokens, encode_text, load_documents, split
from pathswarm.node.model.model import PathModel, build_path
from pathswarm.node.model.router import documents_by_path, route
from pathswarm.node.train.checkpoint import Checkpoint, CheckpointError, load_checkpoint, modules_held
from pathswarm.node.train.inner import evaluate_loss
from pathswarm.protocol.spec import SwarmSpec, format_path


@dataclass
class PathEval:
    path: str
    documents: int
    tokens: int
    loss: float

    @property
    def bits_per_byte(self) -> float:
        return self.loss / math.log(2)


def model_from_checkpoint(spec: SwarmSpec, ckpt: Checkpoint, path: tuple[int, ...]) -> PathModel:
    """Compose a path from the checkpoint's modules; CheckpointError if one is missing."""
    model = build_path(spec, path)
    for mid in model.module_ids:
        if mid not in ckpt.modules:
            raise CheckpointError(
                f"{ckpt.directory}: module {mid} of path {format_path(path)} is not in the checkpoint")
        model.load_module_state(mid, ckpt.modules[mid].weights)
    model.eval()
    return model


def servable_paths(spec: SwarmSpec, ckpt: Checkpoint) -> list[tuple[int, ...]]:
    return [p for p in spec.paths() if all(mid in ckpt.modules for mid in spec.module_ids(p))]


def routed_eval(spec: SwarmSpec, ckpt: Checkpoint, docs: list[Document] | None = None,
                max_batches: int = 16) -> tuple[list[PathEval], PathEval]:
    """Routed validation loss per servable path and overall (token-weighted)."""
    docs = docs if docs is not None else load_documents(spec.data)
    _, val = split(docs, spec.data.val_fraction)
    by_path = documents_by_path(spec, val)
    rows: list[PathEval] = []
    for path in servable_paths(spec, ckpt):
        mine = by_path[path]
        if not mine:
            rows.append(PathEval(format_path(path), 0, 0, float("nan")))
            continue
        model = model_from_checkpoint(spec, ckpt, path)
        batches = TokenSampler(mine, spec.model.context_len, seed=0).eval_batches(spec.inner.batch_size, max_batches)
        loss, n = evaluate_loss(model, batches)
        rows.append(PathEval(format_path(path), len(mine), n, loss))
    if not rows:
        raise CheckpointError(f"{ckpt.directory}: holds no complete path of this swarm")
    counted = [r for r in rows if r.tokens]
    tokens = sum(r.tokens for r in counted)
    overall = sum(r.loss * r.tokens for r in counted) / tokens if tokens else float("nan")
    return rows, PathEval("all", sum(r.documents for r in rows), tokens, overall)


def generate_text(spec: SwarmSpec, checkpoint_dir: str, prompt: str, max_new_bytes: int = 200,
                  temperature: float = 0.8, seed: int = 0) -> tuple[str, str]:
    """Route the prompt to its path and sample a continuation; returns (path, continuation)."""
    if not prompt:
        raise ValueError("the prompt is empty")
    path = spec.path_of_index(route(prompt, spec.router))
    ckpt = load_checkpoint(checkpoint_dir, spec, _path_modules_held(spec, checkpoint_dir, path))
    model = model_from_checkpoint(spec, ckpt, path)
    idx = encode_text(prompt)[-spec.model.context_len:].unsqueeze(0)
    gen = torch.Generator().manual_seed(seed)
    out = model.generate(idx, max_new_bytes, temperature=temperature, generator=gen)
    return format_path(path), decode_tokens(out[0, idx.shape[1]:])


def _path_modules_held(spec: SwarmSpec, checkpoint_dir: str, path: tuple[int, ...]) -> list[str]:
    """The path's modules, when the checkpoint holds them all; else one line that names the path, what the
    checkpoint holds instead, and where to get the rest."""
    wanted = spec.module_ids(path)
    held = modules_held(checkpoint_dir)
    if not held:  # a damaged newest round: load_checkpoint falls back to an intact one, or says what is wrong
        return wanted
    missing = [mid for mid in wanted if mid not in held]
    if missing:
        paths = [format_path(p) for p in spec.paths() if all(mid in held for mid in spec.module_ids(p))]
        raise CheckpointError(
            f"the prompt routes to path {format_path(path)}, but {checkpoint_dir} holds "
            f"{'path ' + ', '.join(paths) if paths else 'no complete path'} (not {', '.join(missing)}): use the "
            f"checkpoint of a node that serves path {format_path(path)}, or the whole model (`pathswarm model pull` "
            "from the swarm, `pathswarm model assemble` from the nodes' checkpoints)")
    return wanted
