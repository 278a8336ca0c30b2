"""Logging for every pathswarm command and process: the level and format chosen on the command line (`-v`, `-q`,
`--log-level`, `--log-format json` for log collectors), and byte counts people can read.

hivemind's own loggers are routed through the same handler and level (protocol/net/start.py calls
`hivemind.utils.logging.use_hivemind_log_handler("nowhere")`: they propagate here), so `-q` quiets them too. A
node's DHT process is forked after this runs and keeps it.
"""

from __future__ import annotations

import json
import logging
import time

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (ISO 8601, UTC), level, logger, message (and the traceback, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
               "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def level_of(verbose: int = 0, quiet: int = 0, log_level: str | None = None) -> int:
    """`--log-level` if given, else INFO moved down by each -v (to DEBUG) and up by each -q (to ERROR)."""
    if log_level:
        return LEVELS[log_level.lower()]
    steps = [logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR]
    return steps[max(0, min(len(steps) - 1, 1 - verbose + quiet))]


def setup_logging(level: int = logging.INFO, fmt: str = "text") -> None:
    """The root logger writes to stderr at `level`, as text (time, level, logger, message) or JSON lines."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT, datefmt="%H:%M:%S"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)


def human_bytes(n: float) -> str:
    """1234567 → '1.2 MB' (decimal units, as network traffic is usually read)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000:
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1000
    return f"{n:.1f} PB"
