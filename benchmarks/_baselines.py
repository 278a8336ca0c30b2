"""One worker of a baseline arm of benchmarks/vs_peers.py: what users would run instead of pathswarm, on exactly
pathswarm's path model, data, inner AdamW, warm-up and gradient clipping.

The orchestrator starts `world` of these, each in its own network namespace with its own IP, and passes that IP;
the worker listens on it only and contacts only the addresses it is given (the master's for DDP, the rendezvous
peers' for hivemind).

Arms (KIND):
  ddp             torch DistributedDataParallel over gloo: one fp32 all-reduce of the gradients per step;
                  global batch = world × batch_size.
  ddp-accum       the same with --accum A micro-steps per step (model.no_sync() on the first A-1);
                  global batch = world × batch_size × A.
  hivemind        hivemind.Optimizer, no local updates: gradients accumulated across peers to
                  target_batch_size = world × batch_size × A, averaged (Float16Compression), one AdamW step.
  hivemind-local  hivemind.Optimizer(use_local_updates=True): an AdamW step on every local batch, parameters
                  averaged each time the collaboration has processed world × batch_size × H samples.

The stop rule: between steps, once this node has processed --tokens-per-node tokens ("done") or --time-cap seconds
of training have passed ("time cap"); a step still blocked --overrun-s after the cap is interrupted ("time cap, step
cut short"). DDP's ranks agree on the time cap (so none is left alone in an all-reduce); hivemind's peers stop
independently, as volunteers would.

Time: t = 0 once every worker has joined (DDP: process group formed and a barrier passed; hivemind: every peer
has written itself into a DHT key, read back by all). Rank 0 saves the un-wrapped model's state_dict to
OUT/snap-NNNN.pt at t = 0, every --snap-every-s seconds (checked between steps) and at the end, for evaluation
after the run (evaluating during it would distort the wall-clock). Every worker writes OUT/worker-RANK.json:
its exact settings, counters, why it stopped, its training loss trace and any error.

    python benchmarks/_baselines.py KIND --rank R --world N --ip IP --master-ip IP0 --port P --spec S --out DIR
        --tokens-per-node T --time-cap S [--accum A] [--H H] [--snap-every-s X] [--rendezvous DIR] [--ifname IF]

--rendezvous must be a fresh, empty folder per run, shared by the workers (hivemind arms: rank 0 writes its DHT
addresses there, the others wait for them).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
from _swarm_common import machine

from pathswarm.jsonfile import write_json_atomic, write_text_atomic
from pathswarm.node.model.data import TokenSampler, load_documents, split
from pathswarm.node.model.model import build_path, param_groups, path_param_count
from pathswarm.node.model.router import documents_of_path
from pathswarm.node.train.inner import set_warmup_lr
from pathswarm.protocol.spec import SwarmSpec, format_path, load_spec

KINDS = ("ddp", "ddp-accum", "hivemind", "hivemind-local")
DONE, TIME_CAP = "done", "time cap"
OVERRUN = "time cap, step cut short"
"""Stop reason when a step was still blocked --overrun-s after the time cap (a collective waiting for a peer that
has left): SIGALRM interrupts it. DDP's step is abandoned; hivemind's step swallows the interruption like a failed
averaging round and applies the local gradients (its documented fallback). The weights are taken as they then are."""

# hivemind.Optimizer's timing, from its documentation (hivemind/optim/optimizer.py, the class docstring's
# "Configuration guide": "matchmaking_time=15.0, # 3-5s for small local runs, 10-15s for training over the internet
# or with many peers", "averaging_timeout=60.0, # around of 2x the actual time it takes to run all-reduce").
# 5 s is also examples/albert/arguments.py's default matchmaking_time (and 60 s its averaging_timeout): a handful of
# peers is the "small run" end of the documented range. The command line can change both; they are recorded.
MATCHMAKING_TIME_S = 5.0
AVERAGING_TIMEOUT_S = 60.0
OVERRUN_S = 30.0
"""How long after the time cap a blocked step may still run before the worker abandons it."""
SHUTDOWN_S = 15.0
"""How long a hivemind worker waits for hivemind.Optimizer.shutdown once training is over."""
SETUP_TIMEOUT_S = 180.0
"""How long a worker waits for its peers to join (process group, rendezvous file, DHT barrier)."""


# ---- pure logic: budgets, batch sizes, settings ---------------------------------------------------
def samples_per_update(kind: str, world: int, batch_size: int, accum: int, H: int) -> int:
    """Samples the whole collaboration processes between two synchronisations: the global batch of one optimizer
    step (ddp, ddp-accum, hivemind's target_batch_size) or, for hivemind-local, between two parameter averagings."""
    per_node = {"ddp": 1, "ddp-accum": accum, "hivemind": accum, "hivemind-local": H}[kind]
    return world * batch_size * per_node


def micro_steps_per_step(kind: str, accum: int) -> int:
    """Local forward/backward passes per global optimizer step of DDP (hivemind decides its steps by itself)."""
    return accum if kind == "ddp-accum" else 1


def stop_reason(tokens: int, elapsed_s: float, tokens_per_node: int, time_cap_s: float) -> str | None:
    """Why to stop now (None: go on). The token budget wins when both are reached."""
    if tokens >= tokens_per_node:
        return DONE
    if elapsed_s >= time_cap_s:
        return TIME_CAP
    return None


def hivemind_optimizer_args(kind: str, world: int, batch_size: int, accum: int, H: int, matchmaking_time: float,
                            averaging_timeout: float) -> dict:
    """hivemind.Optimizer's keyword arguments other than dht, params, optimizer and scheduler, as JSON: compression
    by name (`hivemind_compression` turns them into objects). Every argument we set is here, defaults included where
    the choice matters, so the benchmark's JSON states the configuration."""
    local = kind == "hivemind-local"
    args = {
        "run_id": f"pathswarm-baseline-{kind}",
        "target_batch_size": samples_per_update(kind, world, batch_size, accum, H),
        "batch_size_per_step": batch_size,  # each opt.step() adds one local batch
        "use_local_updates": local,
        "matchmaking_time": matchmaking_time,
        "averaging_timeout": averaging_timeout,
        # Docstring guide and examples/albert: 16-bit wire for both gradients and parameters.
        "state_averaging_compression": "Float16Compression",
        # hivemind's default, stated: synchronous; the delayed (DPU) variants give one round of staleness.
        "delay_optimizer_step": False,
        "delay_grad_averaging": False,
        "delay_state_averaging": True,
        "average_state_every": 1,
        "client_mode": False,
        "verbose": True,  # as the guide and the examples: the log says "averaged with N peers"
    }
    if local:
        # hivemind's default with local updates: the optimizer steps on the model's own parameters. No gradients
        # are averaged, so there is no grad_compression to set (hivemind builds no gradient averager).
        args["offload_optimizer"] = False
    else:
        args["grad_compression"] = "Float16Compression"
        args["reuse_grad_buffers"] = False
        # The guide: "offload_optimizer=True, ... Generally a good practice to use this" (also hivemind's default
        # when params are given without local updates, and examples/albert's).
        args["offload_optimizer"] = True
    return args


def hivemind_compression(args: dict) -> dict:
    """`hivemind_optimizer_args` with the compression names replaced by hivemind's objects."""
    from hivemind.compression import Float16Compression, NoCompression

    known = {"Float16Compression": Float16Compression, "NoCompression": NoCompression}
    return {k: known[v]() if k.endswith("_compression") else v for k, v in args.items()}


def dht_args(ip: str) -> dict:
    """hivemind.DHT's keyword arguments (initial_peers aside): listen on our IP only, and, as pathswarm's own DHT
    does (protocol/net/start.py), never map ports, probe reachability, relay or bootstrap from IPFS, so that p2pd
    contacts no address but the peers it is given."""
    return {"host_maddrs": [f"/ip4/{ip}/tcp/0"], "use_relay": False, "use_auto_relay": False, "auto_nat": False,
            "nat_port_map": False, "use_ipfs": False, "start": True}


def arm_settings(args: argparse.Namespace, spec: SwarmSpec) -> dict:
    """Everything a worker (its parsed command line, `parse`) trains with: enough for the benchmark's JSON to state
    each arm exactly."""
    kind, world, accum, H = args.kind, args.world, args.accum, args.H or spec.inner.steps
    inner, model = spec.inner, spec.model
    path = spec.path_of_index(0)
    B, T = inner.batch_size, model.context_len
    groups = param_groups(build_path(spec, path), inner.lr, inner.weight_decay)
    s: dict = {
        "kind": kind,
        "world": world,
        "spec": str(args.spec),
        "spec_name": spec.name,
        "path": format_path(path),
        "model": {"width": model.width, "levels": list(spec.levels), "n_heads": model.n_heads,
                  "layers_per_module": model.layers_per_module, "context_len": T,
                  "parameters": path_param_count(spec)},
        "data": {"corpus": spec.data.corpus, "val_fraction": spec.data.val_fraction,
                 "documents": "training split routed to the path (router.documents_of_path), as a node's",
                 "sampler": "TokenSampler, seed = rank"},
        "batch_size": B,
        "tokens_per_local_step": B * T,
        "samples_per_update": samples_per_update(kind, world, B, accum, H),
        "optimizer": {"class": "torch.optim.AdamW", "lr": inner.lr, "betas": [inner.beta1, inner.beta2],
                      "eps": 1e-8, "weight_decay": inner.weight_decay,
                      "param_groups": [{"lr": g["lr"], "weight_decay": g["weight_decay"], "tensors": len(g["params"])}
                                       for g in groups]},
        "warmup_steps": inner.warmup_steps,
        "grad_clip": inner.grad_clip,
        "loss": "model(x, y)[1]: mean next-byte cross-entropy of the batch",
        "torch_threads": 1,
        "budget": {"tokens_per_node": args.tokens_per_node, "time_cap_s": args.time_cap, "overrun_s": args.overrun_s,
                   "rule": "stop between steps once this node's tokens (local steps × batch_size × context_len) "
                           "reach tokens_per_node ('done') or time_cap_s of training has passed ('time cap'); "
                           "a step still running overrun_s after the cap is interrupted ('time cap, step cut short')"},
        "snap_every_s": args.snap_every_s,
        "loss_trace_every": args.log_every,
        "ip": args.ip,
    }
    if kind in ("ddp", "ddp-accum"):
        m = micro_steps_per_step(kind, accum)
        s.update({
            "accum": m,
            "global_batch": world * B * m,
            "backend": "gloo",
            "rendezvous": f"TCPStore at {args.master_ip}:{args.port} (as init_method tcp://; rank 0 binds its "
                          "listening socket to that IP)",
            "gloo_socket_ifname": args.ifname,
            "ddp": {"bucket_cap_mb": 25, "find_unused_parameters": False, "gradient_as_bucket_view": False,
                    "broadcast_buffers": True, "note": "torch defaults",
                    "no_sync_on_first_micro_steps": m - 1},
            "allreduce": "fp32 gradients, one bucketed all-reduce per optimizer step, averaged over ranks",
            "loss_scale": f"1/{m} per micro-step (the step's gradient is the mean over its {m} micro-batches)",
            "warmup_unit": "optimizer step (set_warmup_lr before each step, as node/train/inner.py)",
            "grad_clip_applied_to": "the all-reduced gradient, before each optimizer step",
            "stop_consensus": "after each optimizer step an async all_reduce(MAX) of a 1-element time-cap flag, "
                              "read before the next step (the token budget is the same on every rank)",
            "steps_are": "optimizer steps",
        })
    else:
        local = kind == "hivemind-local"
        import hivemind

        s.update({
            "accum": accum,
            "H": H,
            "hivemind_version": hivemind.__version__,
            "hivemind_optimizer": hivemind_optimizer_args(kind, world, B, accum, H, args.matchmaking_time,
                                                          args.averaging_timeout),
            "hivemind_optimizer_callables": {
                "params": "param_groups(model, inner.lr, inner.weight_decay): the muP groups above",
                "optimizer": "lambda params: torch.optim.AdamW(params, betas=(inner.beta1, inner.beta2))",
                "scheduler": None if local else "lambda opt: LambdaLR(opt, lambda epoch: min(1, (epoch + 1) / "
                                                "warmup_steps))",
            },
            "hivemind_dht": {**dht_args(args.ip), "initial_peers": "rank 0's visible maddrs (rendezvous file)"},
            "rendezvous": str(args.rendezvous),
            "load_state_from_peers": "not called: every worker starts from the same seeded initialisation",
            "warmup_unit": ("local step (set_warmup_lr on opt.param_groups before each opt.step(), as a pathswarm "
                            "node's inner steps; hivemind's scheduler would step once per epoch, H times slower)")
            if local else ("hivemind epoch = global optimizer step (scheduler=LambdaLR factor min(1, (epoch+1)/"
                           "warmup_steps), the documented way; same schedule as set_warmup_lr)"),
            "grad_clip_applied_to": "each local batch's gradient before opt.step()" + (
                "" if local else " (as examples/albert via transformers' max_grad_norm; hivemind then accumulates "
                                 "and averages)"),
            "steps_are": "hivemind epochs (opt.local_epoch)",
        })
    return s


def interface_of(ip: str) -> str | None:
    """The network interface holding IPv4 address `ip` (its primary address), for gloo's GLOO_SOCKET_IFNAME."""
    SIOCGIFADDR = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue  # no IPv4 address on this interface
            if socket.inet_ntoa(raw[20:24]) == ip:
                return name
    return None


# ---- signals: a worker always leaves its JSON behind ----------------------------------------------
MAIN_PID = os.getpid()


class Overrun(Exception):
    """The time cap and --overrun-s have passed inside a step."""


def terminated(signum, frame):
    """SIGTERM in the worker: an exception, so that its JSON says so. hivemind's forked helper processes inherit
    this handler (and are stopped by SIGTERM when they shut down slowly): they die as they would have."""
    if os.getpid() != MAIN_PID:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise SystemExit(f"terminated by signal {signum}")


# ---- the record a worker keeps -------------------------------------------------------------------
class Record:
    """Counters, loss trace and snapshots of one worker; written to OUT/worker-RANK.json."""

    def __init__(self, args: argparse.Namespace, settings: dict, tokens_per_step: int):
        self.args, self.settings, self.tokens_per_step = args, settings, tokens_per_step
        self.out = Path(args.out)
        self.started = time.monotonic()
        self.t0: float | None = None
        self.t0_epoch: float | None = None
        self.local_step = self.step = self.tokens = 0
        self.trace: list[list] = []
        self._losses: list[float] = []
        self.snapshots: list[dict] = []
        self._next_snap = 0.0
        self.stop: str | None = None
        self.end_t: float | None = None
        self.error: str | None = None
        self.digest: str | None = None
        self.overran = False

    def start(self) -> None:
        self.t0, self.t0_epoch = time.monotonic(), time.time()
        # A step can block long after the time cap (hivemind waits up to averaging_timeout for a group that a
        # departed peer will never join): SIGALRM cuts it short, --overrun-s after the cap.
        signal.signal(signal.SIGALRM, self._overrun)
        signal.setitimer(signal.ITIMER_REAL, self.args.time_cap + self.args.overrun_s)

    def _overrun(self, signum, frame):
        # Remembered as well as raised: hivemind's step catches every exception (BaseException included), logs
        # "Averaging gradients failed" and goes on with the local gradients, as on its own averaging_timeout.
        self.overran = True
        raise Overrun("a step ran past the time cap and --overrun-s")

    @staticmethod
    def disarm() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)

    def t(self) -> float:
        return 0.0 if self.t0 is None else time.monotonic() - self.t0

    def local(self, loss: float) -> None:
        """One local forward/backward of batch_size sequences done, with this loss."""
        self.local_step += 1
        self.tokens += self.tokens_per_step
        self._losses.append(loss)
        if len(self._losses) >= self.args.log_every:
            self.flush_losses()

    def flush_losses(self) -> None:
        """A trace entry: [t, local_step, mean loss of the batches since the previous entry]."""
        if self._losses:
            self.trace.append([round(self.t(), 3), self.local_step, sum(self._losses) / len(self._losses)])
            self._losses = []

    def should_stop(self) -> str | None:
        if self.overran:
            return OVERRUN
        return stop_reason(self.tokens, self.t(), self.args.tokens_per_node, self.args.time_cap)

    def snapshot(self, model: torch.nn.Module, force: bool = False) -> None:
        """Rank 0 only: the model's weights now, if --snap-every-s has passed since the last (or `force`)."""
        if self.args.rank != 0:
            return
        t = self.t()
        if not force and t < self._next_snap:
            return
        path = self.out / f"snap-{len(self.snapshots):04d}.pt"
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        tmp = path.with_name(f".{path.name}.tmp")
        torch.save({"t": t, "step": self.step, "local_step": self.local_step, "tokens": self.tokens,
                    "state_dict": state}, tmp)
        os.replace(tmp, path)  # the orchestrator may read snapshots while we run: never half of one
        self.snapshots.append({"file": path.name, "t": t, "step": self.step, "local_step": self.local_step,
                               "tokens": self.tokens})
        self._next_snap = t + self.args.snap_every_s

    def finish(self, model: torch.nn.Module) -> None:
        """Training over: its end time, rank 0's last snapshot, and a digest of this worker's weights (DDP
        replicas must agree; hivemind's may drift)."""
        self.disarm()
        self.end_t = self.t()
        self.flush_losses()
        self.snapshot(model, force=True)
        h = hashlib.sha256()
        for k, v in model.state_dict().items():
            h.update(k.encode())
            h.update(v.detach().contiguous().numpy().tobytes())
        self.digest = h.hexdigest()
        self.write("ok")  # the results are final: written before a slow shutdown of the network stack

    def write(self, status: str) -> None:
        self.flush_losses()
        wall = None if self.t0 is None else (self.end_t if self.end_t is not None else self.t())
        write_json_atomic(self.out / f"worker-{self.args.rank}.json", {
            "status": status,
            "kind": self.args.kind, "rank": self.args.rank, "world": self.args.world,
            "settings": self.settings,
            "machine": machine(),
            "t0_epoch": self.t0_epoch,
            "setup_s": None if self.t0 is None else self.t0 - self.started,
            "wall_s": wall,
            "steps": self.step, "local_steps": self.local_step, "tokens": self.tokens,
            "stop_reason": self.stop,
            "stop": self.stop,  # the same, under the name benchmarks/vs_peers.py reads
            "steps_per_s": self.step / wall if wall else None,
            "local_steps_per_s": self.local_step / wall if wall else None,
            "loss_trace": self.trace,
            "snapshots": self.snapshots,
            "final_params_sha256": self.digest,
            "error": self.error,
        })


# ---- the arms --------------------------------------------------------------------------------------
def path_data(spec: SwarmSpec, rank: int) -> tuple[torch.nn.Module, TokenSampler]:
    """The path model a node of path index 0 builds (seeded init) and its training sampler (seed = rank)."""
    path = spec.path_of_index(0)
    model = build_path(spec, path)
    train, _ = split(load_documents(spec.data), spec.data.val_fraction)
    return model, TokenSampler(documents_of_path(spec, train, path), spec.model.context_len, seed=rank)


def make_adamw(params, spec: SwarmSpec) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, betas=(spec.inner.beta1, spec.inner.beta2))


def clip(model: torch.nn.Module, spec: SwarmSpec) -> None:
    if spec.inner.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.inner.grad_clip)


def run_ddp(args: argparse.Namespace, spec: SwarmSpec, rec: Record) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    model, sampler = path_data(spec, args.rank)
    # gloo binds its sockets to this interface's address: ours, not whatever the hostname resolves to.
    os.environ["GLOO_SOCKET_IFNAME"] = args.ifname
    timeout = timedelta(seconds=SETUP_TIMEOUT_S)
    listener = None
    if args.rank == 0:
        # What init_method="tcp://MASTER:PORT" does, except that torch's TCPStore would listen on every address
        # (it has no bind address): we bind its listening socket to our IP and hand it over.
        listener = socket.create_server((args.master_ip, args.port), backlog=max(128, args.world))
    store = dist.TCPStore(args.master_ip, args.port, args.world, args.rank == 0, timeout,
                          master_listen_fd=None if listener is None else listener.fileno())
    dist.init_process_group("gloo", store=store, rank=args.rank, world_size=args.world, timeout=timeout)
    try:
        ddp = DDP(model)
        opt = make_adamw(param_groups(model, spec.inner.lr, spec.inner.weight_decay), spec)
        dist.barrier()
        rec.start()
        rec.snapshot(model, force=True)
        try:
            rec.stop = train_ddp(args, spec, rec, model, ddp, opt, sampler)
        except Overrun:
            rec.stop = OVERRUN
        finally:
            rec.disarm()
        rec.finish(model)
        if rec.stop != OVERRUN:  # a rank that overran may have lost its peers: no barrier to wait at
            dist.barrier()
    finally:
        dist.destroy_process_group()


def train_ddp(args: argparse.Namespace, spec: SwarmSpec, rec: Record, model: torch.nn.Module,
              ddp: torch.nn.Module, opt: torch.optim.Optimizer, sampler: TokenSampler) -> str:
    """DDP's steps until the budget; returns why it stopped."""
    import torch.distributed as dist

    B, A = spec.inner.batch_size, micro_steps_per_step(args.kind, args.accum)
    flag = torch.zeros(1)
    pending = None
    while True:
        if pending is not None:
            pending.wait()  # every rank issued it after the same step: it completes
        if rec.tokens >= args.tokens_per_node:  # the same step count on every rank
            return DONE
        if pending is not None and flag.item() > 0:
            return TIME_CAP
        set_warmup_lr(opt, rec.step, spec.inner.warmup_steps)
        opt.zero_grad(set_to_none=True)
        for a in range(A):
            x, y = sampler.sample(B)
            # The last micro-step's backward all-reduces the accumulated gradient, once per step.
            with ddp.no_sync() if a < A - 1 else contextlib.nullcontext():
                loss = ddp(x, y)[1]
                (loss / A).backward()
            rec.local(loss.item())
        clip(model, spec)
        opt.step()
        rec.step += 1
        # Ranks see the time cap at slightly different moments; one that stopped alone would leave the others
        # in an all-reduce. Agree on it, in the background of the next step (read before the one after).
        flag = torch.tensor([1.0 if rec.t() >= args.time_cap else 0.0])
        pending = dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True)
        rec.snapshot(model)


def start_dht(args: argparse.Namespace):
    """This worker's DHT, joined through the rendezvous folder: rank 0 writes its visible multiaddrs to
    maddrs.txt, the others wait for the file and bootstrap from them."""
    import hivemind

    file = Path(args.rendezvous) / "maddrs.txt"
    if args.rank == 0:
        dht = hivemind.DHT(**dht_args(args.ip))
        write_text_atomic(file, "\n".join(str(m) for m in dht.get_visible_maddrs()) + "\n")
        return dht
    deadline = time.monotonic() + SETUP_TIMEOUT_S
    while not file.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 wrote no {file} in {SETUP_TIMEOUT_S:.0f} s")
        time.sleep(0.1)
    peers = [ln for ln in file.read_text().split() if ln]
    return hivemind.DHT(initial_peers=peers, **dht_args(args.ip))


def dht_barrier(dht, key: str, rank: int, world: int) -> None:
    """Return once every rank has stored itself under `key` (re-stored on every poll: a store made before the
    other peers joined may live on this peer only)."""
    from hivemind.utils import get_dht_time

    deadline = time.monotonic() + SETUP_TIMEOUT_S
    while True:
        dht.store(key, subkey=f"rank{rank}", value=1, expiration_time=get_dht_time() + SETUP_TIMEOUT_S)
        found = dht.get(key, latest=True)
        seen = len(found.value) if found is not None and isinstance(found.value, dict) else 0
        if seen >= world:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"DHT barrier {key}: {seen} of {world} peers after {SETUP_TIMEOUT_S:.0f} s")
        time.sleep(0.2)


def run_hivemind(args: argparse.Namespace, spec: SwarmSpec, rec: Record) -> None:
    import hivemind

    model, sampler = path_data(spec, args.rank)
    warmup = spec.inner.warmup_steps
    dht = start_dht(args)
    opt = None
    try:
        kwargs = hivemind_compression(rec.settings["hivemind_optimizer"])
        if args.kind == "hivemind":
            # The documented way to schedule the lr: per hivemind epoch, i.e. per global optimizer step.
            kwargs["scheduler"] = lambda o: torch.optim.lr_scheduler.LambdaLR(
                o, lambda epoch: min(1.0, (epoch + 1) / warmup) if warmup > 0 else 1.0)
        opt = hivemind.Optimizer(dht=dht, params=param_groups(model, spec.inner.lr, spec.inner.weight_decay),
                                 optimizer=lambda params: make_adamw(params, spec), **kwargs)
        dht_barrier(dht, f"{kwargs['run_id']}_start", args.rank, args.world)
        rec.start()
        rec.snapshot(model, force=True)
        try:
            rec.stop = train_hivemind(args, spec, rec, model, opt, sampler)
        except Overrun:
            rec.stop = OVERRUN
        finally:
            rec.disarm()
        rec.finish(model)
    finally:
        if opt is not None:
            # hivemind's shutdown first waits for the background averaging round, which, once the other peers
            # have left, lasts until averaging_timeout: bounded here (the results are written already).
            closing = threading.Thread(target=opt.shutdown, daemon=True)
            closing.start()
            closing.join(SHUTDOWN_S)
        dht.shutdown()


def train_hivemind(args: argparse.Namespace, spec: SwarmSpec, rec: Record, model: torch.nn.Module, opt,
                   sampler: TokenSampler) -> str:
    """hivemind.Optimizer's steps, one local batch each, until the budget; returns why it stopped."""
    local = args.kind == "hivemind-local"
    while True:
        reason = rec.should_stop()
        if reason:
            return reason
        if local:
            set_warmup_lr(opt, rec.local_step, spec.inner.warmup_steps)
        opt.zero_grad()
        x, y = sampler.sample(spec.inner.batch_size)
        loss = model(x, y)[1]
        loss.backward()
        clip(model, spec)
        opt.step()
        rec.step = opt.local_epoch
        rec.local(loss.item())
        rec.snapshot(model)


# ---- command line -----------------------------------------------------------------------------------
def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=KINDS)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--ip", required=True, help="this worker's own IPv4 address: it listens there only")
    ap.add_argument("--master-ip", help="rank 0's IP (DDP's TCPStore); default --ip")
    ap.add_argument("--port", type=int, default=29500, help="DDP: rank 0's TCPStore port")
    ap.add_argument("--ifname", help="DDP: the interface holding --ip, for gloo (default: found from --ip)")
    ap.add_argument("--spec", required=True, help="the swarm's TOML spec")
    ap.add_argument("--out", required=True, help="folder for worker-RANK.json and rank 0's snap-NNNN.pt")
    ap.add_argument("--tokens-per-node", type=int, required=True)
    ap.add_argument("--time-cap", type=float, required=True, help="seconds of training wall-clock at most")
    ap.add_argument("--accum", type=int, default=1, help="ddp-accum, hivemind: local batches per global batch")
    ap.add_argument("--H", type=int, default=None, help="hivemind-local: local steps per averaging "
                                                         "(default: the spec's inner.steps)")
    ap.add_argument("--snap-every-s", type=float, default=10.0)
    ap.add_argument("--rendezvous", help="hivemind: a fresh folder shared by the workers (default: --out)")
    ap.add_argument("--log-every", type=int, default=5, help="local steps per loss-trace entry")
    ap.add_argument("--matchmaking-time", type=float, default=MATCHMAKING_TIME_S)
    ap.add_argument("--averaging-timeout", type=float, default=AVERAGING_TIMEOUT_S)
    ap.add_argument("--overrun-s", type=float, default=OVERRUN_S,
                    help="abandon a step still running this long after the time cap")
    args = ap.parse_args(argv)
    if not 0 <= args.rank < args.world:
        ap.error(f"--rank {args.rank} is not in [0, {args.world})")
    if args.accum < 1 or (args.H is not None and args.H < 1):
        ap.error("--accum and --H must be at least 1")
    args.master_ip = args.master_ip or args.ip
    args.rendezvous = args.rendezvous or args.out
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(1)
    signal.signal(signal.SIGTERM, terminated)  # the orchestrator's kill still leaves a JSON behind
    Path(args.out).mkdir(parents=True, exist_ok=True)
    rec = None
    try:
        spec = load_spec(args.spec)
        args.H = args.H or spec.inner.steps
        if args.kind.startswith("ddp") and not args.ifname:
            args.ifname = interface_of(args.ip)
            if args.ifname is None:
                raise ValueError(f"no interface holds {args.ip}: pass --ifname")
        rec = Record(args, arm_settings(args, spec), spec.inner.batch_size * spec.model.context_len)
        rec.write("running")
        (run_ddp if args.kind.startswith("ddp") else run_hivemind)(args, spec, rec)
    except BaseException as e:
        text = "".join(traceback.format_exception(e))
        if rec is None:  # failed before training was set up: what we know
            write_json_atomic(Path(args.out) / f"worker-{args.rank}.json",
                              {"status": "failed", "kind": args.kind, "rank": args.rank, "world": args.world,
                               "error": text})
        else:
            rec.error = text
            rec.write("failed")
        raise
    rec.write("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
