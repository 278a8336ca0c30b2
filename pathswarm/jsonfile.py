"""Files written whole or not at all: a reader (another process, a test, a person) sees the old contents
or the new, never half of either. Status and ready files, checkpoint manifests, results of runs.

The text goes to a temporary file beside the target, then `os.replace` swaps it in (atomic on POSIX
within one file system). The temporary name holds the writer's process and thread, so writers of the
same file never write into each other's; a writer killed mid-write leaves at most one such file behind.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_text_atomic(path: str | Path, text: str, *, durable: bool = False) -> Path:
    """Replace `path`'s contents by `text` in one step (creating its folder). `durable`: fsync the file
    and its folder too, so the new contents survive a power cut once this returns (checkpoints)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_native_id()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)
    return path


def write_json_atomic(path: str | Path, payload: Any, *, sort_keys: bool = False,
                      default: Callable[[Any], Any] | None = None, durable: bool = False) -> Path:
    """`payload` as indented JSON (one space, a final newline), written with `write_text_atomic`.
    `default` turns values json cannot write into ones it can (e.g. `str`)."""
    text = json.dumps(payload, indent=1, sort_keys=sort_keys, default=default) + "\n"
    return write_text_atomic(path, text, durable=durable)


def fsync_dir(path: str | Path) -> None:
    """Make a folder's entries (a rename into it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
