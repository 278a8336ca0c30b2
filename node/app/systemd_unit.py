"""A systemd user unit that runs `pathswarm node run` unattended (`pathswarm node unit`).

The node already behaves as a service wants: SIGTERM leaves the swarm cleanly (the round in flight settled or
abandoned, a checkpoint written, the claim withdrawn) and exits 0; bad input exits 2, which no restart can fix; any
other exit is a failure worth restarting after a pause (a crash, the machine's network gone). The unit says exactly
that, with the interpreter this package runs under and the node's arguments as given (relative paths made absolute:
a unit runs from the user's home).
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

BAD_INPUT_EXIT = 2
"""The node's exit code for bad input (README, "Commands"): restarting cannot fix it."""
RESTART_S = 15
"""Pause before a restart: long enough for a claim to lapse less than a round behind, short enough not to miss many."""
STOP_TIMEOUT_S = 90
"""How long systemd waits after SIGTERM before SIGKILL: a node leaving settles its round (a grace window) and saves."""


def absolute_args(args: Sequence[str], cwd: Path | None = None) -> list[str]:
    """The node's arguments with every relative path that exists made absolute (`--swarm swarm.toml`,
    `--membership member.cert`, `--checkpoint-dir runs/a`, in either `--opt value` or `--opt=value` form); other
    values as they are."""
    cwd = cwd or Path.cwd()

    def fix(value: str) -> str:
        if value and not value.startswith("-") and not Path(value).is_absolute() and (cwd / value).exists():
            return str((cwd / value).resolve())
        return value

    out = []
    for arg in args:
        if arg.startswith("--") and "=" in arg:
            name, _, value = arg.partition("=")
            out.append(f"{name}={fix(value)}")
        else:
            out.append(fix(arg))
    return out


def unit_text(node_args: Sequence[str], description: str = "pathswarm training node",
              python: str | None = None) -> str:
    """The unit file (systemd.service(5)) running `python -m pathswarm node run NODE_ARGS`."""
    command = shlex.join([python or sys.executable, "-m", "pathswarm", "node", "run", *node_args])
    if "%" in command:
        command = command.replace("%", "%%")  # systemd expands %-specifiers in ExecStart
    return "\n".join([
        "[Unit]",
        f"Description={description}",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        f"ExecStart={command}",
        "Environment=PYTHONUNBUFFERED=1",
        "# SIGTERM: the node leaves the swarm cleanly and exits 0.",
        f"TimeoutStopSec={STOP_TIMEOUT_S}",
        "Restart=on-failure",
        f"RestartSec={RESTART_S}",
        f"# Exit {BAD_INPUT_EXIT} is bad input (a spec, a certificate, an option): fix it, then start the unit again.",
        f"RestartPreventExitStatus={BAD_INPUT_EXIT}",
        "",
        "[Install]",
        "WantedBy=default.target",
        "",
    ])
