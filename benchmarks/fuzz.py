"""Fuzz run of every parser of peer data: hostile inputs by the hundred thousand, and what came out.

Each parser a peer can reach gets --per-parser inputs (default 100,000) from the harness the unit tests
use (tests/fuzzing.py: the same generators and contracts, drawn here from a seeded `random`): random
data, and mutations of valid inputs (DHT records and owner subkeys, membership certificates, framed
messages, requests to and replies from the module exchange, codec frames, spec text) so the deeper
checks are reached. The parsers: `parse_record`, `SwarmRecordValidator.validate`, `peer_id_of_owner`,
membership `parse` / `verify` / `Gate.check`, `read_message`, `field_of`, the exchange's
`_on_contribute` and `_on_state` handlers (driven offline: a fake stream in, a sink out), its state
download `fetch_state` and the reply side of `contribute` (fake PeerStreams answer), codec `decode`,
`loads_spec`.

Counted per parser: inputs, accepted, refused (a bool / None answer: validators, handlers),
typed errors (the parser's own error class, by message start), other exceptions (any other class,
or an accepted input breaking the parser's contract; each is a bug), hangs (one input over 1 s, cut
by SIGALRM), the slowest input and the process's peak RSS. The run is single-threaded, in-process.
Inputs are seeded per parser; the keys (RSA owner, Ed25519 swarm owner) are fresh each run, so the
counts of inputs built from them vary slightly between runs.

    python benchmarks/fuzz.py --json benchmarks/results/fuzz.json [--per-parser 100000] [--seed 0]
"""

from __future__ import annotations

import logging
import random
import resource
import signal
import sys
import time
from collections import Counter

import torch
from _codec_fuzz import HANG_SECONDS, error_kind
from _swarm_common import arguments, machine, write_json

from tests.fuzzing import FRAME_MAX_ELEMENTS, FUZZERS, LOOP, Fuzzer, outcome


# ---- the run ---------------------------------------------------------------------------------------------
class Hang(BaseException):
    """Raised by SIGALRM inside a parser that ran past HANG_SECONDS (a BaseException: no parser swallows it)."""


def _alarm(signum, frame) -> None:
    raise Hang()


def peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB


def fuzz_one(fuzzer: Fuzzer, count: int, seed: int) -> dict:
    rng = random.Random(f"{seed}/{fuzzer.name}")  # a parser's inputs do not depend on the others'
    outcomes, typed, others = Counter(), Counter(), Counter()
    slowest, hangs, rss_before, start = 0.0, 0, peak_rss_mb(), time.perf_counter()
    for _ in range(count):
        inp = fuzzer.generate(rng)
        began = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, HANG_SECONDS)
        try:
            kind, error = outcome(fuzzer, inp)
            outcomes[kind] += 1
            if error is not None:
                typed[error_kind(str(error))] += 1
        except Hang:
            hangs += 1
            LOOP.reset()
        except Exception as e:  # noqa: BLE001 - the point of the fuzz run is to count these
            others[f"{type(e).__name__}: {str(e)[:120]}"] += 1
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        slowest = max(slowest, time.perf_counter() - began)
    return dict(inputs=count, accepted=outcomes["accepted"], refused=outcomes["refused"],
                typed_errors=outcomes["typed_error"], other_exceptions=sum(others.values()),
                other_exception_kinds=dict(others.most_common(20)), hangs_over_1s=hangs,
                slowest_ms=round(1e3 * slowest, 3), seconds=round(time.perf_counter() - start, 1),
                peak_rss_mb=peak_rss_mb(), rss_growth_mb=round(peak_rss_mb() - rss_before, 1),
                typed_errors_by_message_start=dict(typed.most_common(15)))


def main() -> None:
    ap = arguments(__doc__, "fuzz")
    ap.add_argument("--per-parser", type=int, default=100_000, help="inputs per parser")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="", help="comma-separated parser names (default: all)")
    args = ap.parse_args()

    torch.set_num_threads(1)
    # Every refused record and unknown msgpack ext type is a log line: at this volume, noise.
    logging.getLogger("hivemind").setLevel(logging.ERROR)
    logging.getLogger("pathswarm").setLevel(logging.ERROR)
    signal.signal(signal.SIGALRM, _alarm)
    chosen = [f for f in FUZZERS if not args.only or f.name in args.only.split(",")]
    rss_at_start = peak_rss_mb()  # torch, hivemind, and bitsandbytes (imported by codec.py's methods)
    results = {}
    for fuzzer in chosen:
        results[fuzzer.name] = fuzz_one(fuzzer, args.per_parser, args.seed)
        r = results[fuzzer.name]
        print(f"{fuzzer.name:36s} {r['inputs']:>7d} in  {r['accepted']:>7d} accepted  {r['refused']:>7d} refused  "
              f"{r['typed_errors']:>7d} typed  {r['other_exceptions']:>3d} other  {r['hangs_over_1s']:>3d} hangs  "
              f"slowest {r['slowest_ms']:.1f} ms  peak RSS {r['peak_rss_mb']:.0f} MB", flush=True)
    LOOP.reset()
    bugs = sum(r["other_exceptions"] + r["hangs_over_1s"] for r in results.values())
    write_json(args.json, {
        "benchmark": "fuzz", "command": "python benchmarks/fuzz.py " + " ".join(sys.argv[1:]),
        "machine": machine(),
        "settings": {"per_parser": args.per_parser, "seed": args.seed, "hang_seconds": HANG_SECONDS,
                     "codec_max_elements": FRAME_MAX_ELEMENTS, "peak_rss_mb_before_fuzzing": rss_at_start},
        "parsers": results,
        "total": {"inputs": sum(r["inputs"] for r in results.values()), "other_exceptions_and_hangs": bugs},
        "only_typed_errors": bugs == 0,
    })
    sys.exit(1 if bugs else 0)


if __name__ == "__main__":
    main()
