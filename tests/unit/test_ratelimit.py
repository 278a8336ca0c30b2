"""Per-peer token buckets (protocol/ratelimit.py): burst, refill, isolation between peers, bounded table."""

import pytest

from pathswarm.protocol.ratelimit import RateLimiter


def test_a_peer_gets_its_burst_then_the_rate():
    rl = RateLimiter(rate=2.0, burst=5)
    assert [rl.allow("a", now=0.0) for _ in range(7)] == [True] * 5 + [False] * 2
    assert rl.refused == 2
    assert rl.allow("a", now=0.5)  # 0.5 s at 2/s refills one token
    assert not rl.allow("a", now=0.5)
    assert [rl.allow("a", now=100.0) for _ in range(6)] == [True] * 5 + [False]  # refill caps at the burst


def test_one_flooding_peer_does_not_starve_the_others():
    rl = RateLimiter(rate=1.0, burst=3)
    flood = [rl.allow("flooder", now=0.001 * i) for i in range(1000)]
    assert sum(flood) <= 4
    assert all(rl.allow(f"peer{i}", now=1.0) for i in range(50))


def test_the_table_is_bounded_and_logging_is_throttled():
    rl = RateLimiter(rate=1.0, burst=1, max_peers=10)
    for i in range(100):
        rl.allow(f"p{i}", now=float(i))
    assert len(rl._buckets) <= 10
    assert rl.should_log("p99", now=100.0) and not rl.should_log("p99", now=120.0) and rl.should_log("p99", now=161)
    with pytest.raises(ValueError):
        RateLimiter(rate=0, burst=1)


def test_a_node_refuses_a_flood_of_state_requests_and_still_serves_others():
    import asyncio

    from ..fuzzing import LOOP, Sink, check_reply, exchange, message, read, reader_of

    request = message({"module": "shared"})

    async def go():
        ex = exchange(private=False)
        statuses = []
        for peer in ["QmFlooder"] * 40 + ["QmHonest"]:
            sink = Sink()
            await ex.service._on_state(peer, reader_of(request), sink)
            statuses.append(bytes(sink.data))
        return statuses, ex.trust.guard.limits["state"].refused

    replies, refused = asyncio.run(go())
    assert all(check_reply(r) in ("accepted", "refused") for r in replies)  # well-formed replies
    statuses = [LOOP.run(read(r, 1 << 20))[0] for r in replies]
    assert [s["status"] for s in statuses[:16]] == ["ok"] * 16  # the burst
    assert all(s == {"status": "refused", "reason": "rate limited"} for s in statuses[16:40])
    assert statuses[40]["status"] == "ok" and refused == 24


def test_slots_bound_requests_in_service_per_peer_and_in_all():
    from pathswarm.protocol.ratelimit import Slots

    s = Slots(per_peer=2, total=3)
    assert [s.take("a"), s.take("a"), s.take("a")] == [True, True, False]  # a's two slots
    assert s.take("b") and not s.take("c")  # all three in use
    s.give("a")
    assert s.take("c") and s.in_use == 3 and s.refused == 2
    for peer in ("a", "b", "c"):
        s.give(peer)
    assert s.in_use == 0 and s._busy == {}  # the table keeps only peers in service
    with pytest.raises(ValueError):
        s.give("a")


class StalledSink:
    """A writer whose peer never reads: every drain after the first `free` bytes waits forever."""

    def __init__(self, free: int = 0):
        import asyncio

        self.data, self.free, self.closed = bytearray(), free, False
        self._never = asyncio.Event()

    def write(self, data) -> None:
        self.data += bytes(data)

    async def drain(self) -> None:
        if len(self.data) > self.free:
            await self._never.wait()

    def close(self) -> None:
        self.closed = True


def test_a_peer_that_never_reads_a_state_holds_its_slots_a_chunk_and_only_until_the_deadline():
    """docs/SECURITY.md, "RPC caller": each unread state request used to pin a whole copy of the state (245 MB for a
    25M-parameter module) for as long as the peer kept the stream open."""
    import asyncio
    import dataclasses

    import torch

    from pathswarm.protocol.rounds.exchange import ModuleExchange
    from pathswarm.protocol.rounds.outer import OuterState
    from pathswarm.protocol.wire import WRITE_CHUNK

    from ..fuzzing import XSPEC, Sink, message, read, reader_of

    numel = 200_000  # 1.6 MB of state: 24 chunks
    state = OuterState(torch.linspace(-1, 1, numel), torch.zeros(numel), 3)
    request = message({"module": "shared"})

    async def go():
        ex = ModuleExchange(XSPEC, None, "me", {"shared": numel}, lambda m: state)
        ex.trust.guard.budgets["state"] = dataclasses.replace(ex.trust.guard.budgets["state"], deadline_s=0.5)
        stalled = [StalledSink() for _ in range(2)]
        first = [asyncio.create_task(ex.service._on_state("QmSlow", reader_of(request), s)) for s in stalled]
        await asyncio.sleep(0.1)
        again, other = Sink(), Sink()
        await ex.service._on_state("QmSlow", reader_of(request), again)  # its two slots are taken
        await ex.service._on_state("QmOther", reader_of(request), other)  # others are served meanwhile
        busy_while_stalled = ex.trust.guard.slots["state"].in_use
        await asyncio.wait_for(asyncio.gather(*first), 5.0)  # cut at the deadline
        after = Sink()
        await ex.service._on_state("QmSlow", reader_of(request), after)  # its slot is free again
        return ex, stalled, again, other, after, busy_while_stalled

    ex, stalled, again, other, after, busy = asyncio.run(go())
    assert all(len(s.data) <= 64 + 200 + WRITE_CHUNK and s.closed for s in stalled)  # a chunk, not the state
    assert ex.trust.guard.cut == 2 and busy == 2 and ex.trust.guard.slots["state"].in_use == 0
    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(read(bytes(again.data), 0))[0] == {"status": "refused", "reason": "busy"}
        for sink in (other, after):
            header, payload = loop.run_until_complete(read(bytes(sink.data), 8 * numel))
            assert header["status"] == "ok" and header["round"] == 3
            assert payload == torch.cat([state.anchor, state.momentum]).numpy().tobytes()
    finally:
        loop.close()
