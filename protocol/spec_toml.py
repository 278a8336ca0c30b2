"""A spec's tables ↔ its dataclasses: TOML text and dicts in, plain dicts (for the canonical JSON) and TOML out.

`build` converts a parsed table into a section's dataclass, checking each value's type against the field's annotation
(an error names the key); `to_plain` is the inverse, the form the swarm id hashes. Pure code: no networking, no torch.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
import typing
from typing import Any

from pathswarm.protocol.spec_sections import SpecError, require


# ---- reading ---------------------------------------------------------------------------------
def to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple | list):
        return [to_plain(v) for v in obj]
    return obj


def _convert(value: Any, tp: Any, key: str) -> Any:
    """Convert a TOML value to the annotated type, with an error naming the key."""
    origin = typing.get_origin(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        require(isinstance(value, dict), key, f"must be a table, got {type(value).__name__}")
        return build(tp, value, key + ".")
    if origin is tuple:
        args = typing.get_args(tp)
        require(isinstance(value, list), key, f"must be an array, got {type(value).__name__}")
        inner = args[0]
        return tuple(_convert(v, inner, f"{key}[{i}]") for i, v in enumerate(value))
    if tp is bool:
        require(isinstance(value, bool), key, f"must be true or false, got {value!r}")
        return value
    if tp is int:
        require(isinstance(value, int) and not isinstance(value, bool), key, f"must be an integer, got {value!r}")
        return value
    if tp is float:
        require(isinstance(value, int | float) and not isinstance(value, bool), key,
                f"must be a number, got {value!r}")
        # TOML has inf, nan and integers of any size (float() of a huge one raises OverflowError); a spec's
        # id is JSON, which has none of them.
        require(math.isfinite(value) if isinstance(value, float) else abs(value) < 2**1023, key,
                "must be a finite number")
        return float(value)
    if tp is str:
        require(isinstance(value, str), key, f"must be a string, got {value!r}")
        return value
    raise SpecError(f"{key}: unsupported type {tp!r}")


def build(cls: type, table: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for k in table:
        if k not in names:
            raise SpecError(f"{prefix}{k}: unknown key (known: {', '.join(sorted(names))})")
    kwargs = {k: _convert(v, hints[k], prefix + k) for k, v in table.items()}
    return cls(**kwargs)


def parse_toml(text: str, source: str = "<spec>") -> dict[str, Any]:
    """The table a spec's TOML text holds; SpecError naming `source` if it is not TOML."""
    try:
        return tomllib.loads(text)
    # Beyond TOMLDecodeError, tomllib lets out ValueError for an integer of over 4300 digits and RecursionError
    # for deeply nested arrays or inline tables; spec text comes from peers, so all of them are a SpecError.
    except (ValueError, RecursionError) as e:
        raise SpecError(f"{source}: not valid TOML ({e})") from None


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
