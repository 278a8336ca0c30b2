"""A flooding peer for tests/swarm/test_hostile.py: test code, never part of the product.

It joins a swarm's DHT with a fresh identity and, for SECONDS, floods one victim node with requests of every kind
its exchange serves (docs/SECURITY.md, "RPC caller"): state downloads it never reads (each used to pin a copy of
the module's state for as long as the stream stayed open), contributions with junk frames, stance questions and
audit-frame requests, WORKERS at a time, as fast as the victim answers. Writes a JSON report: requests sent per
kind, and the first word of every answer it got ("ok", "refused: rate limited", "refused: busy", ...).

    python -m tests.hostile_flood SPEC INITIAL_PEER VICTIM_STATUS_JSON REPORT_JSON SECONDS
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path

from pathswarm.protocol.net import start_net
from pathswarm.protocol.netloop import NetLoop
from pathswarm.protocol.rounds.context import PROTOCOL_VERSION
from pathswarm.protocol.spec import load_spec
from pathswarm.protocol.wire import read_message, write_message

WORKERS = 8  # requests in flight at once (more only costs the machine the test runs on)
HOLD_S = 20.0  # how long an unread state download is kept open
MAX_HELD = 200  # unread state downloads open at once


def victim_of(status_path: str) -> dict:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            st = json.loads(Path(status_path).read_text())
            if st.get("round", 0) >= 1:
                return st
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    raise SystemExit("the victim never trained a round")


async def flood(streams, victim: str, prefix: str, seconds: float, sent: Counter, answers: Counter) -> None:
    end = time.monotonic() + seconds
    junk = bytes(range(256)) * 64
    requests = {
        "state": ({"module": "shared"}, None),
        "contribute": ({"module": "shared", "round": 1, "tokens": 5, "digest": "0" * 64}, junk),
        "stance": ({"module": "shared", "round": 1, "digest": "0" * 64}, None),
        "frames": ({"module": "shared", "round": 1}, None),
    }
    held: set[asyncio.Task] = set()

    async def hold(writer) -> None:
        await asyncio.sleep(HOLD_S)
        writer.close()

    async def one(kind: str) -> None:
        header, then = requests[kind]
        reader, writer = await streams.open(victim, f"pathswarm.{prefix}.{kind}")
        await write_message(writer, header, b"")
        if then is not None:
            await write_message(writer, {}, then)
        sent[kind] += 1
        if kind == "state" and len(held) < MAX_HELD:  # never read: the stream stays open with the reply unread
            task = asyncio.ensure_future(hold(writer))
            held.add(task)
            task.add_done_callback(held.discard)
            return
        try:
            reply, _ = await asyncio.wait_for(read_message(reader, 1 << 20), 5.0)
            said = reply.get("status") or reply.get("stance")
            answers[f"{kind}: {said} {str(reply.get('reason', ''))[:20]}".strip()] += 1
        finally:
            writer.close()

    async def worker(i: int) -> None:
        kinds = list(requests)
        n = i
        while time.monotonic() < end:
            try:
                await one(kinds[n % len(kinds)])
            except Exception as e:  # the victim cut us off: that is its defence working
                answers[f"error {type(e).__name__}"] += 1
                await asyncio.sleep(0.05)
            n += 1

    await asyncio.gather(*(worker(i) for i in range(WORKERS)))
    await asyncio.gather(*held, return_exceptions=True)


def main(spec_path: str, initial_peer: str, victim_status: str, report: str, seconds: float) -> None:
    spec = load_spec(spec_path)
    victim = victim_of(victim_status)["peer_id"]
    sdht = start_net([initial_peer], spec=spec)
    loop = NetLoop()
    sent: Counter[str] = Counter()
    answers: Counter[str] = Counter()
    try:
        streams = loop.run(sdht.streams(), 30)
        print("flooding", flush=True)
        loop.run(flood(streams, victim, f"{spec.swarm_id[:16]}.{PROTOCOL_VERSION}", seconds, sent, answers),
                 seconds + HOLD_S + 30)
        Path(report).write_text(json.dumps({"peer_id": sdht.peer_id, "sent": sent, "answers": answers}))
    finally:
        loop.stop()
        sdht.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]))
