"""Error feedback for outer gradients (Seide et al. 2014; Karimireddy et al. 2019, arXiv 1901.09847).

Each round a module's pseudo-gradient is encoded together with the quantisation residual left over from
the previous round, and the new residual (what was sent minus what peers will decode) is kept for the
next one. The errors telescope: after R rounds the sum of what peers decoded differs from the sum of
the true tensors by the last residual alone, instead of by R independent errors.
"""

from __future__ import annotations

import torch

from pathswarm.compression.base import Codec


class ErrorFeedback:
    """The residual of one module (one tensor shape); use one instance per module."""

    def __init__(self) -> None:
        self.residual: torch.Tensor | None = None
        """float32, flat: what the last frame left out; None before the first round."""
        self.last_norm = 0.0
        """The norm of what the last frame encoded (the outer gradient plus the decayed residual)."""

    def encode(self, tensor: torch.Tensor, codec: Codec, decay: float = 1.0) -> bytes:
        """Encode tensor + decay · residual with `codec` (any kind, compression/registry.py) and keep the new
        residual: what was sent minus what the codec says a peer will decode (for the sparse codec, every entry not
        sent this round, whole, and the rounding of those sent). `decay` < 1 is SparseLoCo's error feedback
        (e ← decay·e + Δ: the buffer is the momentum). `last_norm` is then the norm of what the frame encoded.

        If encoding fails (NaN / Inf, bad arguments) the residual is left as it was."""
        codec.check(tensor)
        compensated = tensor.detach().to("cpu", torch.float32, copy=True).reshape(-1)
        if self.residual is not None:
            if self.residual.numel() != compensated.numel():
                raise ValueError(f"this ErrorFeedback holds a residual of {self.residual.numel()} values but got "
                                 f"a tensor of {compensated.numel()}: use one ErrorFeedback per module")
            compensated.add_(self.residual, alpha=decay)
        self.last_norm = float(torch.linalg.vector_norm(compensated))
        frame, decoded = codec.encode_values(compensated, tuple(tensor.shape), tensor.dtype, want_decoded=True)
        if decoded is None:
            raise TypeError(f"{type(codec).__name__}.encode_values ignored want_decoded")
        self.residual = compensated.sub_(decoded.float())
        return frame

    def reset(self) -> None:
        """Forget the residual (e.g. after the module's state was replaced by a peer's)."""
        self.residual = None

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {} if self.residual is None else {"residual": self.residual.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        residual = state.get("residual")
        self.residual = None if residual is None else residual.detach().to(torch.float32).reshape(-1).clone()
