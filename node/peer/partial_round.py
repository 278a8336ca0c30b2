"""A round in progress, saved every few seconds, so that a crashed or stopped node resumes it.

The round checkpoint (node/train/checkpoint.py) holds each module's anchor as of its last outer round: a node
killed mid-round loses every inner step since then, on average half a round of its compute. This file
holds what the round checkpoint does not:
  - per module, the local weights, and, while an outer gradient is in flight, the weights it was made
    from: the node resumes at anchor + (local − sent), keeping only the steps not yet sent. Steps already
    sent are not kept: if their round merged, the swarm's next anchor holds them; keeping them too would
    apply them twice. With nothing in flight the local weights come back exactly;
  - the inner optimizer's state (AdamW's moments, or AdamW8bit's 8-bit ones with their maps and scales) and step
    counts, and the node's inner step (its warm-up position);
  - the tokens those steps stand for (this round's, and any carried over from a round that did not merge), and the
    node's counters as of the save (node/peer/counters.py), read by the next run whether it resumes the round or not.
It names the anchors it was made against (round and digest per module) and is used only on top of those
same anchors: after a checkpoint of a later round, it is stale and ignored. The node adopts newer state
from peers afterwards the way a re-sync does, keeping this progress on top of the new anchor.

One file, `PARTIAL.safetensors` in the checkpoint root, replaced atomically (write, rename), and deleted
when its steps are sent (PartialRounds.on_send). No fsync: it guards against a killed process, whose written
pages the OS still flushes; after a power loss a torn file fails its sha256 and the node starts the round
afresh, as it would without this file.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from pathswarm.node.train.checkpoint import owned
from pathswarm.node.train.inner import optimizer_kind
from pathswarm.protocol.spec import SwarmSpec, format_path

FILE = "PARTIAL.safetensors"
MAX_HEADER_BYTES = 100 << 20  # safetensors' own bound on a header
FORMAT = "2"  # 2: the counters replace "uncounted_tokens" (a step is counted trained as it ends)


@dataclass
class Resumed:
    """What `load_partial` put back into the worker: tokens the run that trained them counted as trained, unmerged
    until their round merges (node/peer/counters.py)."""

    round_tokens: int
    """Tokens of the inner steps trained since the last send."""
    round_steps: int
    """How many inner steps those are: the node's first round after the restart trains only the rest."""
    carry: dict[str, int]
    """module → tokens carried over from rounds that did not merge (their steps are in the restored weights)."""
    inner_step: int


def _params(worker) -> list[torch.Tensor]:
    return [p for g in worker.opt.param_groups for p in g["params"]]


_STATE_KEYS = {"adamw": ({"exp_avg", "exp_avg_sq"},),
               # AdamW8bit: 8-bit moments with their quantisation maps and block scales, or, for tensors under its
               # min_8bit_size, two 32-bit moments under the same names
               "adamw8bit": ({"state1", "state2", "qmap1", "qmap2", "absmax1", "absmax2"}, {"state1", "state2"})}


def _fits(state: dict[str, torch.Tensor], p: torch.Tensor, kind: str) -> bool:
    """A saved optimizer state of one parameter has the keys `kind` makes, moments of the parameter's shape, and
    finite floats."""
    if set(state) not in _STATE_KEYS[kind]:
        return False
    moments = ("exp_avg", "exp_avg_sq") if kind == "adamw" else ("state1", "state2")
    return all(state[k].shape == p.shape for k in moments) and all(
        bool(torch.isfinite(t).all()) for t in state.values() if t.is_floating_point())


def discard_partial(root: str | Path) -> None:
    """Remove the saved round in progress (its steps are being sent: resuming them could apply them twice)."""
    (Path(root) / FILE).unlink(missing_ok=True)


def _digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].contiguous().view(torch.uint8).numpy())  # the buffer itself, not a copy of it
    return h.hexdigest()


def save_partial(root: str | Path, spec: SwarmSpec, worker, bases: dict[str, torch.Tensor],
                 carry: dict[str, int], counters: dict[str, Any] | None = None) -> Path:
    """Write the round in progress: per module, the flat local weights, and bases[mid] where that is not the anchor
    (the weights of the outer gradient in flight); `carry` is the tokens of unmerged steps still in the weights;
    `counters` the node's counters as of now (kept as given: `saved_counters` reads them back)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    # written before the caller trains on: the tensors need no snapshot of their own (`owned` copies views only)
    tensors: dict[str, torch.Tensor] = {}
    anchors = {}
    for mid in worker.module_ids:
        st = worker.outer[mid]
        tensors[f"local.{mid}"] = worker.flat(mid).contiguous()
        if (residual := worker.feedback[mid].residual) is not None:  # error feedback: what frames have not carried
            tensors[f"feedback.{mid}"] = owned(residual.float())
        if not torch.equal(bases[mid], st.anchor):
            tensors[f"sent.{mid}"] = owned(bases[mid].float())
        anchors[mid] = [st.round, st.digest()]
    steps = {}
    for i, p in enumerate(_params(worker)):
        st = worker.opt.state.get(p)
        if st:  # every tensor of the state: AdamW's two moments, or AdamW8bit's 8-bit moments, maps and scales
            for key, value in st.items():
                if torch.is_tensor(value) and key != "step":
                    # AdamW8bit's quantisation maps are one tensor shared by every parameter: each gets a copy
                    tensors[f"opt.{i}.{key}"] = value.detach().to("cpu").clone() if key.startswith("qmap") \
                        else owned(value)
            steps[str(i)] = int(st["step"])
    meta = {"format": FORMAT, "swarm_id": spec.swarm_id, "path": format_path(worker.path),
            "anchors": json.dumps(anchors), "round_tokens": str(int(worker.round_tokens)),
            "round_steps": str(int(worker.round_steps)), "counters": json.dumps(counters),
            "sha256": _digest(tensors),
            "carry": json.dumps({m: int(n) for m, n in carry.items() if m in worker.module_ids}),
            "inner_step": str(int(worker.inner_step)), "opt_steps": json.dumps(steps),
            "optimizer": optimizer_kind(worker.opt)}
    final = root / FILE
    tmp = root / f".{FILE}.tmp"  # one name: a write cut short by a kill is overwritten by the next, never piles up
    save_file(tensors, str(tmp), metadata=meta)
    os.replace(tmp, final)
    return final


class PartialError(ValueError):
    """The saved round cannot be resumed on top of these anchors (the message says why)."""


def saved_counters(root: str | Path, swarm_id: str) -> Any:
    """The counters the saved round in progress of swarm `swarm_id` holds, as written (None: no file, no counters in
    it, or another swarm's). Reads the header only, and whether the round itself can be resumed or not: a stale round
    still tells how far the node had counted when it saved it."""
    try:
        with open(Path(root) / FILE, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if n > MAX_HEADER_BYTES:
                return None
            meta = json.loads(f.read(n)).get("__metadata__", {})
        return json.loads(meta["counters"]) if (meta.get("format"), meta.get("swarm_id")) == (FORMAT, swarm_id) \
            else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _read(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The file's tensors and metadata (PartialError when there is none, or it is unreadable)."""
    if not path.is_file():
        raise PartialError("no round in progress was saved")
    try:
        tensors = load_file(str(path))
        with open(path, "rb") as f:  # safetensors' own header parse, for the metadata
            n = int.from_bytes(f.read(8), "little")
            meta = json.loads(f.read(n)).get("__metadata__", {})
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise PartialError(f"unreadable ({e})") from None
    return tensors, meta


def _weights(tensors: dict[str, torch.Tensor], anchors: dict, worker) -> dict[str, torch.Tensor]:
    """Module → the flat weights to resume: anchor + the steps not sent yet (PartialError when they do not fit)."""
    weights = {}
    for mid in worker.module_ids:
        st = worker.outer[mid]
        if anchors.get(mid) != [st.round, st.digest()]:
            raise PartialError(f"made against another state of {mid} (a later round was checkpointed)")
        local, sent = tensors.get(f"local.{mid}"), tensors.get(f"sent.{mid}")
        n = st.anchor.numel()
        if any(t is None or t.dtype != torch.float32 or t.numel() != n or not torch.isfinite(t).all()
               for t in ((local,) if sent is None else (local, sent))):
            raise PartialError(f"no usable progress for {mid}")
        local = local.reshape(-1)
        weights[mid] = local if sent is None else st.anchor + (local - sent.reshape(-1))
        feedback = tensors.get(f"feedback.{mid}")
        if feedback is not None and (feedback.numel() != n or not torch.isfinite(feedback).all()):
            raise PartialError(f"error-feedback residual of {mid} does not fit")
    return weights


def load_partial(root: str | Path, spec: SwarmSpec, worker) -> Resumed:
    """Put a saved round in progress back into `worker`, whose anchors must be the ones it was saved against.
    Raises PartialError (and changes nothing) if there is none, or it does not fit."""
    tensors, meta = _read(Path(root) / FILE)
    try:
        if meta.get("sha256") != _digest(tensors):
            raise PartialError("its tensors fail their sha256 (a torn write)")
        if meta.get("format") != FORMAT or meta.get("swarm_id") != spec.swarm_id:
            raise PartialError("saved by another swarm or format")
        if meta.get("path") != format_path(worker.path):
            raise PartialError(f"saved on path {meta.get('path')}, this node trains {format_path(worker.path)}")
        weights = _weights(tensors, json.loads(meta["anchors"]), worker)
        steps = {int(i): int(s) for i, s in json.loads(meta["opt_steps"]).items()}
        moments: dict[int, tuple[int, dict[str, torch.Tensor]]] = {}
        params = _params(worker)
        # A round saved under the other inner optimizer (the node was restarted with another --optimizer) resumes its
        # weights, and its optimizer starts afresh.
        same_optimizer = meta.get("optimizer", "adamw") == optimizer_kind(worker.opt)
        for i, s in steps.items() if same_optimizer else ():
            state = {k.split(".", 2)[2]: t for k, t in tensors.items() if k.startswith(f"opt.{i}.")}
            if not 0 <= i < len(params) or s < 1 or not _fits(state, params[i], optimizer_kind(worker.opt)):
                raise PartialError("inner optimizer state does not fit the model")
            moments[i] = (s, state)
        carry = {m: int(n) for m, n in json.loads(meta["carry"]).items() if m in worker.module_ids}
        round_tokens, inner_step = int(meta["round_tokens"]), int(meta["inner_step"])
        round_steps = int(meta["round_steps"])
        if min(round_tokens, round_steps, inner_step) < 0 or any(n < 0 for n in carry.values()):
            raise PartialError("negative counts")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        if isinstance(e, PartialError):
            raise
        raise PartialError(f"bad metadata ({e})") from None
    # Everything checked: only now change the worker.
    for mid, w in weights.items():
        worker.set_flat(mid, w)
        if (feedback := tensors.get(f"feedback.{mid}")) is not None:
            worker.feedback[mid].residual = feedback.float().reshape(-1).clone()
    for i, (s, state) in moments.items():
        p = params[i]
        # Moments come back in the parameter's dtype (AdamW) or as saved (AdamW8bit's uint8 states, fp32 maps).
        worker.opt.state[p] = {"step": s, **{k: t.to(p.device, p.dtype if k.startswith("exp_avg") else t.dtype)
                                             for k, t in state.items()}}
    worker.inner_step, worker.round_tokens, worker.round_steps = inner_step, round_tokens, round_steps
    return Resumed(round_tokens=round_tokens, round_steps=round_steps, carry=carry, inner_step=inner_step)
