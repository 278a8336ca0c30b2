"""The swarm spec: what every peer of a swarm agrees on, loaded from TOML into frozen dataclasses.

A spec fixes the architecture (levels of modules, width, depth), the router, the inner and outer
optimisers, the codec, the averaging rules and the data. `swarm_id` is the sha256 of the spec's
canonical JSON form, so key order and TOML formatting never change it and any value does; every DHT
key of a swarm is prefixed with it, so nodes of different specs never mix.

This file holds `SwarmSpec` (the whole, its paths and modules, its id) and loading; the sections are in
spec_sections.py and spec_codec.py, the conversion to and from TOML in spec_toml.py. Every name is importable
from here. Pure code: no networking, no torch.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pathswarm.protocol.spec_codec import CodecSpec
from pathswarm.protocol.spec_sections import (
    INNER_OPTIMIZERS,
    AveragingSpec,
    DataSpec,
    InitSpec,
    InnerOptSpec,
    MembershipSpec,
    ModelSpec,
    OuterOptSpec,
    RouterSpec,
    SpecError,
    require,
)
from pathswarm.protocol.spec_toml import build, dump_toml, parse_toml, to_plain

__all__ = [
    "CREATED_SLACK_S", "INNER_OPTIMIZERS", "MAX_ROUNDS_PER_S", "AveragingSpec", "CodecSpec", "DataSpec", "InitSpec",
    "InnerOptSpec", "MembershipSpec", "ModelSpec", "OuterOptSpec", "RouterSpec", "SpecError", "SwarmSpec",
    "dump_toml", "format_path", "load_spec", "loads_spec", "module_id", "parse_path", "spec_from_dict",
]


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
        require(len(self.levels) > 0, "levels", "must list at least one level")
        require(0 <= self.created < 1 << 40, "created", "must be a unix time in seconds (0: not stated)")
        for i, k in enumerate(self.levels):
            require(isinstance(k, int) and k > 0, f"levels[{i}]", f"must be a positive integer, got {k!r}")
        self.model.validate()
        self.router.validate(self.n_paths)
        self.inner.validate()
        self.outer.validate()
        self.codec.validate()
        self.averaging.validate()
        self.data.validate()
        self.membership.validate()
        self.init.validate(len(self.all_module_ids()))
        if self.outer.kind == "sparseloco":
            require(self.codec.error_feedback and not self.codec.feedback_in_weights, "codec.feedback",
                    'outer.kind "sparseloco" keeps what a frame did not carry in its decaying buffer: set '
                    '[codec] error_feedback = true and feedback = "buffer"')

    def round_limit(self, now: float) -> int | None:
        """The latest outer round any module of this swarm can honestly be at, at unix time `now`: the swarm's age
        plus CREATED_SLACK_S, times MAX_ROUNDS_PER_S. None when the spec does not say when it was created."""
        if not self.created:
            return None
        return int((max(0.0, now - self.created) + CREATED_SLACK_S) * MAX_ROUNDS_PER_S)

    def require_router(self) -> SwarmSpec:
        require(self.router.fitted, "router.centroids",
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
            if self.n_paths <= 16:
                valid = "the valid paths are " + ", ".join(format_path(self.path_of_index(i))
                                                            for i in range(self.n_paths))
            else:
                valid = "a path takes one index per level, level i's from 0 to its size − 1"
            raise ValueError(f"path {format_path(path)} does not fit levels {list(self.levels)}: {valid}")

    def module_ids(self, path: tuple[int, ...]) -> list[str]:
        """Module ids a path holds: 'shared' then one 'L{level}M{module}' per level."""
        self.check_path(path)
        return ["shared"] + [module_id(level, m) for level, m in enumerate(path)]

    def all_module_ids(self) -> list[str]:
        return ["shared"] + [module_id(lv, m) for lv, k in enumerate(self.levels) for m in range(k)]

    # ---- identity ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out = to_plain(self)
        if not self.created:
            del out["created"]  # not stated: the id of a spec written before the field stays what it was
        if self.averaging.slices == 1:
            del out["averaging"]["slices"]  # the default, as before the field existed: the same id
        if self.outer.kind == "nesterov":  # likewise: a spec from before SparseLoCo keeps its id
            del out["outer"]["kind"], out["outer"]["beta"]
        if not self.outer.eager:  # the default, as before the field existed: the same id
            del out["outer"]["eager"]
        if self.codec.mean_k_per_chunk == 0:
            del out["codec"]["mean_k_per_chunk"]
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
def spec_from_dict(table: dict[str, Any]) -> SwarmSpec:
    """Build and validate a spec (router included) from a parsed TOML / JSON table."""
    require("router" in table, "router", "missing: the spec has no fitted router (run `pathswarm swarm init`)")
    return build(SwarmSpec, table).require_router()


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
    return spec_from_dict(parse_toml(text, source))
