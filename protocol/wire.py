"""Framing of pathswarm's peer-to-peer messages over libp2p streams, bounded before allocation.

A message is `magic(4) | header_len(u32) | payload_len(u64) | header JSON | payload bytes`. The
reader checks both lengths against the caller's limits *before* reading the bodies, so a peer
cannot make us allocate more than we agreed to (hivemind's own `receive_raw_data` has no bound).
Every byte sent and received is counted in a `Traffic`, which is what the wire benchmark reports.
"""

from __future__ import annotations

import asyncio
import json
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

MAGIC = b"PSW1"
_PREFIX = struct.Struct("<4sIQ")
MAX_HEADER_BYTES = 256 * 1024  # a result of MAX_LISTED (1024) contributors: ~70 KB (peer, tokens) and its candidates
WRITE_CHUNK = 1 << 16
READ_CHUNK = 1 << 20  # a payload read with an idle check comes in pieces of at most this
"""Bytes written between two drains of a message's payload."""



class NotServingYetError(ConnectionError):
    """The peer is up but serves no handler of that name yet (a node between its claim and its exchange's start);
    raised by protocol/net/streams.py's PeerStreams.open."""


class UnreachableError(ConnectionError):
    """No connection to the peer could be made (p2pd could dial none of its addresses: down, or gone); raised by
    protocol/net/streams.py's PeerStreams.open."""


class FramesMissingError(LookupError):
    """The peer answered that it keeps no frames of the round asked for (it did not reduce it, or no longer has them:
    a restarted reducer); raised by protocol/rounds/audit.py's `fetch_frames`."""


class WireError(ValueError):
    """A peer sent a malformed, oversized or truncated message."""


@dataclass
class Traffic:
    """Bytes this process sent and received on pathswarm streams (thread-safe counters)."""

    sent: int = 0
    received: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, sent: int = 0, received: int = 0) -> None:
        with self._lock:
            self.sent += sent
            self.received += received


class Pacer:
    """An upload cap shared by the messages that take it (a token bucket of one second's bytes): `await
    take(n)` returns once n more bytes fit under `bytes_per_s` (0: no cap). For the event loop that awaits it."""

    def __init__(self, bytes_per_s: float):
        if not bytes_per_s >= 0 or bytes_per_s == float("inf"):
            raise ValueError(f"an upload cap of {bytes_per_s} B/s")
        self.bytes_per_s = bytes_per_s
        self._free_at = float("-inf")  # loop time at which the bytes taken so far have gone out at the cap

    def delay(self, n: int, now: float) -> float:
        """Seconds to wait before sending n more bytes at time `now` (and count them as sent)."""
        if not self.bytes_per_s:
            return 0.0
        # a burst of up to a second's bytes goes at once; beyond it each chunk waits its turn
        self._free_at = max(self._free_at, now - 1.0) + n / self.bytes_per_s
        return max(0.0, self._free_at - now)

    async def take(self, n: int) -> None:
        if wait := self.delay(n, asyncio.get_running_loop().time()):
            await asyncio.sleep(wait)


async def write_message(writer: asyncio.StreamWriter, header: dict[str, Any],
                        payload: bytes | memoryview | Sequence[bytes | memoryview] = b"",
                        traffic: Traffic | None = None, pacer: Pacer | None = None,
                        idle_s: float | None = None) -> None:
    """One message; `payload` may come in parts (sent back to back, as one payload). Written chunk by chunk with a
    drain after each, so a peer that does not read pins at most a chunk and the transport's buffer, not the
    payload (the caller's deadline then ends the wait); with a `pacer`, each chunk waits for its share of the cap;
    with `idle_s`, a chunk the peer does not take within that long ends the message (WireError: stalled)."""
    parts = [memoryview(p).cast("B") for p in ([payload] if isinstance(payload, bytes | memoryview) else payload)]
    size = sum(len(p) for p in parts)
    head = json.dumps(header, separators=(",", ":")).encode()
    if len(head) > MAX_HEADER_BYTES:
        raise WireError(f"header of {len(head)} bytes exceeds {MAX_HEADER_BYTES}")
    prefix = _PREFIX.pack(MAGIC, len(head), size)
    writer.write(prefix + head)
    for view in parts:
        for off in range(0, len(view), WRITE_CHUNK):
            if pacer is not None:
                await pacer.take(min(WRITE_CHUNK, len(view) - off))
            writer.write(view[off:off + WRITE_CHUNK])
            await _drain(writer, idle_s)
    await _drain(writer, idle_s)
    if traffic is not None:
        traffic.add(sent=len(prefix) + len(head) + size)


async def _drain(writer: asyncio.StreamWriter, idle_s: float | None) -> None:
    if idle_s is None:
        await writer.drain()
        return
    try:
        await asyncio.wait_for(writer.drain(), idle_s)
    except TimeoutError:
        raise WireError(f"stalled: the peer took nothing for {idle_s:g} s") from None


async def _read_payload(reader: asyncio.StreamReader, n: int, idle_s: float | None,
                        traffic: Traffic | None) -> bytes:
    """n bytes; with `idle_s`, in chunks that must each arrive within that long (a slow link may take minutes for a
    large payload, a dead one is found within idle_s), each counted in `traffic` as it arrives (a progress display
    follows a long download); without, counted by the caller once read."""
    if idle_s is None:
        return await reader.readexactly(n)
    out = bytearray()
    while len(out) < n:
        try:
            chunk = await asyncio.wait_for(reader.read(min(READ_CHUNK, n - len(out))), idle_s)
        except TimeoutError:
            raise WireError(f"stalled: nothing for {idle_s:g} s after {len(out):,} of {n:,} bytes") from None
        out += chunk
        if traffic is not None:
            traffic.add(received=len(chunk))
        if reader.at_eof() and len(out) < n:
            raise asyncio.IncompleteReadError(bytes(out), n)
    return bytes(out)


async def read_message(reader: asyncio.StreamReader, max_payload: int,
                       traffic: Traffic | None = None, idle_s: float | None = None) -> tuple[dict[str, Any], bytes]:
    """One message, its payload at most `max_payload` bytes; `idle_s`: see `_read_payload`."""
    try:
        prefix = await reader.readexactly(_PREFIX.size)
    except asyncio.IncompleteReadError as e:
        raise WireError("connection closed before a message arrived") from e
    magic, head_len, payload_len = _PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise WireError(f"bad magic {magic!r}")
    if head_len > MAX_HEADER_BYTES:
        raise WireError(f"header of {head_len} bytes exceeds {MAX_HEADER_BYTES}")
    if payload_len > max_payload:
        raise WireError(f"payload of {payload_len} bytes exceeds the limit of {max_payload}")
    try:
        head = await reader.readexactly(head_len)
        payload = await _read_payload(reader, payload_len, idle_s, traffic) if payload_len else b""
    except asyncio.IncompleteReadError as e:
        raise WireError("message truncated") from e
    if traffic is not None:  # the payload read in chunks (idle_s) was counted as it came
        traffic.add(received=_PREFIX.size + head_len + (0 if idle_s is not None else payload_len))
    try:
        header = json.loads(head)
    # RecursionError: a header of nested brackets ('[' * 16384 fits in MAX_HEADER_BYTES) exhausts json's stack.
    except (ValueError, RecursionError) as e:
        raise WireError(f"header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise WireError("header is not a JSON object")
    return header, payload


async def discard_rest(reader: asyncio.StreamReader, max_bytes: int, timeout_s: float) -> None:
    """Read and drop what the peer still sends, until it closes, `max_bytes` or `timeout_s`.

    A handler that refuses a request before reading all of it must call this before closing: closing a
    stream with unread bytes resets it, and the reset can destroy the refusal we just wrote before the
    peer reads it (the peer then sees "connection closed" instead of the reason)."""
    async def drain() -> None:
        left = max_bytes
        while left > 0 and (chunk := await reader.read(min(left, 1 << 16))):
            left -= len(chunk)
    try:
        await asyncio.wait_for(drain(), timeout_s)
    except (TimeoutError, ConnectionError, OSError):
        pass


def field_of(header: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    """A header field of the expected type, else WireError (bool is not an int here)."""
    value = header.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise WireError(f"header field {name!r} missing or of the wrong type")
    return value
