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
            await ex._on_state(peer, reader_of(request), sink)
            statuses.append(bytes(sink.data))
        return statuses, ex.limits["state"].refused

    replies, refused = asyncio.run(go())
    assert all(check_reply(r) in ("accepted", "refused") for r in replies)  # well-formed replies
    statuses = [LOOP.run(read(r, 1 << 20))[0] for r in replies]
    assert [s["status"] for s in statuses[:16]] == ["ok"] * 16  # the burst
    assert all(s == {"status": "refused", "reason": "rate limited"} for s in statuses[16:40])
    assert statuses[40]["status"] == "ok" and refused == 24
