"""DiLoCo's outer optimisation as pure functions over flat tensors (arXiv 2311.08105).

After H inner steps a worker's *pseudo-gradient* (outer gradient) for a module is
Δ = anchor − local: the direction the inner steps moved the weights, negated so it behaves like a
gradient. The holders of a module average their Δ weighted by the tokens each trained on, then every
holder applies the same Nesterov momentum step to its anchor copy:

    buf ← μ·buf + Δ̄ ;  step = Δ̄ + μ·buf (Nesterov) or buf (heavy ball) ;  anchor ← anchor − lr·step

except in a module's first `outer.warmup_rounds` rounds, which merge by plain averaging (anchor ← anchor − Δ̄,
the buffer untouched): the round number is part of the replicated state, so every replica makes the same choice.

This matches torch.optim.SGD(momentum=μ, nesterov=True, dampening=0) applied to Δ̄. Everything here is
deterministic for a given input order, which is what keeps the replicas of a module bit-identical.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from pathswarm.protocol.spec import OuterOptSpec


def pseudo_gradient(anchor: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """Δ = anchor − local (fp32)."""
    if anchor.shape != local.shape:
        raise ValueError(f"anchor shape {tuple(anchor.shape)} != local shape {tuple(local.shape)}")
    return anchor.float() - local.float()


def nesterov_step(anchor: torch.Tensor, momentum: torch.Tensor, grad: torch.Tensor, cfg: OuterOptSpec,
                  round_: int | None = None) -> None:
    """Apply one outer step in place to `anchor` and `momentum` (both fp32 flat tensors); `round_`: the module's
    round before the step (a round below cfg.warmup_rounds is plain averaging; None: always the Nesterov step)."""
    if not (anchor.shape == momentum.shape == grad.shape):
        raise ValueError("anchor, momentum and outer gradient must have the same shape")
    if cfg.kind == "sparseloco":  # a plain step: the members' decaying error feedback is the momentum
        anchor.sub_(grad, alpha=cfg.lr)
        return
    if round_ is not None and round_ < cfg.warmup_rounds:
        anchor.sub_(grad)
        return
    momentum.mul_(cfg.momentum).add_(grad)
    step = grad.add(momentum, alpha=cfg.momentum) if cfg.nesterov else momentum
    anchor.sub_(step, alpha=cfg.lr)


@dataclass(frozen=True, eq=False)
class OuterState:
    """One module's outer state: the anchor weights and the Nesterov buffer (flat fp32), its round and who reduces
    the next one. The one type of a module's state, on the training side and on the wire (served to joiners,
    closed by reducers); immutable: a round makes a new one (`stepped`), so a state handed to the network thread
    never changes under it, and its digest is computed once."""

    anchor: torch.Tensor
    momentum: torch.Tensor
    round: int = 0
    reducers: tuple[str, ...] = ()
    """Who reduces the next round, in failover order, as the result of the last round named them (every member
    that applied it holds the same list; empty before the first round). Not part of the digest."""

    @classmethod
    def fresh(cls, weights: torch.Tensor) -> OuterState:
        w = weights.detach().float().clone()
        return cls(anchor=w, momentum=torch.zeros_like(w), round=0)

    def stepped(self, avg_pseudo_grad: torch.Tensor, cfg: OuterOptSpec,
                reducers: tuple[str, ...] | None = None) -> OuterState:
        """The state after one outer step with the round's mean (this one is left as it is)."""
        anchor, momentum = self.anchor.clone(), self.momentum.clone()
        nesterov_step(anchor, momentum, avg_pseudo_grad, cfg, self.round)
        return OuterState(anchor, momentum, self.round + 1, self.reducers if reducers is None else tuple(reducers))

    def with_reducers(self, reducers: tuple[str, ...]) -> OuterState:
        """The same state naming other candidates (the digest, which does not cover them, is kept)."""
        out = OuterState(self.anchor, self.momentum, self.round, tuple(reducers))
        if "_digest" in self.__dict__:
            object.__setattr__(out, "_digest", self.__dict__["_digest"])
        return out

    def digest(self) -> str:
        """Hash of anchor, momentum and round: equal on every replica after a good round (computed once: hashing a
        25 M-value module's state costs ~0.1 s)."""
        if "_digest" not in self.__dict__:
            object.__setattr__(self, "_digest", state_digest(self.anchor, self.momentum, self.round))
        return self.__dict__["_digest"]


def state_digest(anchor: torch.Tensor, momentum: torch.Tensor, round_: int) -> str:
    h = hashlib.sha256()
    h.update(round_.to_bytes(8, "little"))
    for t in (anchor, momentum):
        # The array's buffer itself: .tobytes() copied it first, which doubled the cost (about 0.1 s for a 12.6M-value
        # module's anchor and momentum, several times a round). Same bytes, same digest.
        h.update(t.detach().contiguous().float().numpy())  # type: ignore[arg-type]  # numpy's stubs: buffer on 3.12+
    return h.hexdigest()  # full length: a 64-bit cut was enough against accidents, not against a peer that grinds
