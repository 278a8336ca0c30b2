"""Large payloads on slow links (protocol/wire.py): with an idle check, a payload that keeps arriving is read to its
end however long it takes, one that stops is cut after the idle time; a state transfer's deadline grows with its size
(protocol/rounds/state_parts.py)."""

import asyncio
import json
import struct

import pytest

from pathswarm.protocol.rounds.state_parts import FLOOR_BYTES_PER_S, transfer_deadline_s
from pathswarm.protocol.wire import MAGIC, WireError, read_message

PAYLOAD = bytes(range(256)) * 1024  # 256 KiB


def message(payload: bytes) -> bytes:
    head = json.dumps({"status": "ok"}).encode()
    return struct.pack("<4sIQ", MAGIC, len(head), len(payload)) + head + payload


async def trickle(reader: asyncio.StreamReader, data: bytes, pieces: int, pause_s: float, stop_after: int | None):
    step = -(-len(data) // pieces)
    for i in range(pieces):
        if stop_after is not None and i == stop_after:
            return  # the sender stalls: nothing more, the stream stays open
        reader.feed_data(data[i * step:(i + 1) * step])
        await asyncio.sleep(pause_s)
    reader.feed_eof()


def read(pieces: int, pause_s: float, idle_s: float, stop_after: int | None = None):
    async def go():
        reader = asyncio.StreamReader()
        feeding = asyncio.create_task(trickle(reader, message(PAYLOAD), pieces, pause_s, stop_after))
        try:
            return await read_message(reader, len(PAYLOAD), idle_s=idle_s)
        finally:
            feeding.cancel()
    return asyncio.run(go())


def test_the_prefix_is_what_the_wire_module_packs():
    # the helper above must build real messages: a round trip through read_message without an idle check
    async def go():
        reader = asyncio.StreamReader()
        reader.feed_data(message(b"abc"))
        reader.feed_eof()
        return await read_message(reader, 3)
    assert asyncio.run(go()) == ({"status": "ok"}, b"abc")


def test_a_payload_that_keeps_coming_is_read_whatever_its_total_time():
    header, payload = read(pieces=20, pause_s=0.03, idle_s=0.2)  # ≈ 0.6 s in all, never 0.2 s idle
    assert header == {"status": "ok"} and payload == PAYLOAD


def test_a_payload_that_stops_is_cut_after_the_idle_time():
    with pytest.raises(WireError, match="stalled"):
        read(pieces=20, pause_s=0.0, idle_s=0.2, stop_after=10)


def test_a_transfer_deadline_grows_with_its_size():
    assert transfer_deadline_s(20.0, 0) == 20.0
    # a 25 M-parameter path's anchor and momentum (204 MB) from one home uplink needs ~82 s at 20 Mbit/s:
    # its deadline allows it at 1 Mbit/s
    assert transfer_deadline_s(20.0, 204_000_000) == pytest.approx(20.0 + 204_000_000 / FLOOR_BYTES_PER_S)
    assert transfer_deadline_s(20.0, 204_000_000) > 204_000_000 / 2_500_000


def test_a_chunked_read_counts_its_bytes_as_they_come_and_once():
    from pathswarm.protocol.wire import Traffic

    async def go():
        reader, traffic = asyncio.StreamReader(), Traffic()
        seen = []

        async def watch():
            while True:
                seen.append(traffic.received)
                await asyncio.sleep(0.01)

        watching = asyncio.create_task(watch())
        feeding = asyncio.create_task(trickle(reader, message(PAYLOAD), 10, 0.03, None))
        try:
            await read_message(reader, len(PAYLOAD), traffic, idle_s=1.0)
        finally:
            watching.cancel()
            feeding.cancel()
        return traffic.received, seen

    received, seen = asyncio.run(go())
    assert received == len(message(PAYLOAD))  # every byte once
    assert any(0 < s < len(PAYLOAD) for s in seen)  # a progress display saw it grow mid-message
