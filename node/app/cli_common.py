"""What every `pathswarm` command shares: one line and exit code 2 for a user's mistake, JSON output, spec loading.

Every user-facing failure (bad spec, missing data, corrupt checkpoint, bad option value) is one line
on stderr and exit code 2; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps

import click

from pathswarm.jsonfile import write_json_atomic
from pathswarm.protocol.spec import SwarmSpec, load_spec

EXIT_USAGE = 2


USER_ERRORS = (ValueError, OSError)
"""What a user's mistake raises: a bad option value, a missing file, and every typed error of the library, which are
ValueErrors (SpecError, DataError, CheckpointError, NetStartError, MembershipError, …)."""


def friendly(fn: Callable) -> Callable:
    """Turn expected failures into one clear line and exit code 2 (traceback only with --debug)."""

    @wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as e:
            ctx = click.get_current_context()
            if ctx.find_root().obj and ctx.find_root().obj.get("debug"):
                raise
            click.echo(f"error: {e}", err=True)
            sys.exit(EXIT_USAGE)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)

    return wrapper


def load_spec_option(path: str) -> SwarmSpec:
    return load_spec(path)


def write_json(path: str | None, payload: dict) -> None:
    if path:
        write_json_atomic(path, payload, sort_keys=True)
        click.echo(f"wrote {path}")
