"""`pathswarm node id`, `pathswarm node run` and `pathswarm bootstrap`: the commands that run a peer of a swarm.

They parse options, check what can be checked before anything slow starts, and hand over to the node
(node/peer/node.py) or the bootstrap peer (bootstrap/peer.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from pathswarm.bootstrap.peer import run_bootstrap
from pathswarm.node.app.cli_common import friendly
from pathswarm.node.app.node_display import run_with_display
from pathswarm.node.peer.joining import resolve_identity, resolve_swarm
from pathswarm.protocol.identity import default_node_identity, ensure_identity, peer_id_of_identity

# node/peer/node.py is imported inside `node run`, after the checks of its options, spec and membership, so that
# `--help` and a mistyped option or path answer at once: it imports torch and hivemind, ~3.0 s (python -X
# importtime, on top of what `--help` loads).


@click.group()
def node() -> None:
    """Run a training node."""


@node.command("id")
@click.option("--identity", type=click.Path(dir_okay=False), default=None,
              help="Identity file (default: ~/.local/share/pathswarm/identities/node.key, created if missing).")
@friendly
def node_id(identity: str | None) -> None:
    """Print this node's peer id: what the owner of a private swarm needs to invite it."""
    path = ensure_identity(Path(identity) if identity else default_node_identity())
    click.echo(peer_id_of_identity(path))
    click.echo(f"(identity {path})", err=True)


@node.command("unit", context_settings={"ignore_unknown_options": True})
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write the unit here, e.g. ~/.config/systemd/user/pathswarm-node.service (default: print it).")
@click.option("--force", is_flag=True, help="Overwrite an existing --output.")
@click.argument("node_args", nargs=-1, type=click.UNPROCESSED)
@friendly
def node_unit(output: str | None, force: bool, node_args: tuple[str, ...]) -> None:
    """Write a systemd user unit that runs `pathswarm node run NODE_ARGS` unattended.

    The node's arguments come after `--`; they are checked as `node run` checks them, and relative paths are made
    absolute. The unit restarts the node on failure (not after exit 2, bad input) and stops it with SIGTERM, on which
    it leaves the swarm cleanly. Then:

        systemctl --user daemon-reload && systemctl --user enable --now pathswarm-node

    (`loginctl enable-linger $USER` keeps it running while you are logged out; `journalctl --user -u pathswarm-node`
    shows its log.) Example:

        pathswarm node unit -o ~/.config/systemd/user/pathswarm-node.service -- --swarm public
    """
    from pathswarm.node.app.systemd_unit import absolute_args, unit_text

    if not node_args:
        raise click.UsageError("give the node's arguments after --, e.g. `pathswarm node unit -- --swarm public`")
    args = absolute_args(node_args)
    try:
        node_run.make_context("node run", list(args))  # parsed and checked as `node run` would, not run
    except click.exceptions.Exit:  # `--help` among them: its help was printed
        return
    except click.ClickException as e:
        raise click.UsageError(f"the node's arguments: {e.format_message()}") from None
    text = unit_text(args)
    if output is None:
        click.echo(text, nl=False)
        return
    out = Path(output).expanduser()
    if out.exists() and not force:
        raise click.UsageError(f"{out} exists; pass --force to overwrite it")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    click.echo(f"wrote {out}; start it with: systemctl --user daemon-reload && "
               f"systemctl --user enable --now {out.stem}", err=True)


@node.command("plan")
@click.option("--swarm", "spec_path", default=None, help="The swarm's spec (TOML), or 'public'.")
@click.option("--join", "join_id", default=None, help="The swarm's id: its spec is fetched through --initial-peer.")
@click.option("--initial-peer", "initial_peers", multiple=True, help="A peer of the swarm (with --join).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="Where the node would train: its memory is the budget unless --vram says otherwise.")
@click.option("--vram", default=None, help="Memory budget for training, e.g. 8GiB or 8GB (GB = 10^9 bytes, GiB = "
                                          "2^30; default: the device's total memory for cuda, the available RAM for "
                                          "cpu).")
@friendly
def node_plan(spec_path: str | None, join_id: str | None, initial_peers: tuple[str, ...], device: str,
              vram: str | None) -> None:
    """Print what training one path of the swarm needs in memory, and the settings that fit.

    \b
    Per path: fp32 weights and gradients, the inner optimizer's state (AdamW, AdamW8bit), the activations kept for
    the backward pass at the spec's context (counted on PyTorch's meta device: nothing is allocated), the peak of a
    training step, and the outer state in host memory. Then, for each optimizer, the largest micro-batch that fits
    in 90 % of the budget (gradients accumulated over the spec's batch). Exits 1 when nothing fits.

    \b
    pathswarm node plan --swarm swarm.toml --device cuda --vram 8GiB
    """
    from pathswarm.node.train.memory import device_budget, fits, parse_bytes, plan_path

    spec, _ = resolve_swarm(spec_path, join_id, tuple(initial_peers))
    try:
        budget = parse_bytes(vram) if vram else device_budget(device)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--vram") from None
    path = spec.path_of_index(0)
    m = plan_path(spec, path)  # every path has the same shape: one shared module and one module per level
    batch = spec.inner.batch_size

    def mb(n: int) -> str:
        return f"{n / 2**20:,.1f} MiB" if n < 2**30 else f"{n / 2**30:,.2f} GiB"

    click.echo(f"swarm {spec.name} ({spec.swarm_id[:12]}): {spec.n_paths} path(s) of {m.params:,} parameters each, "
               f"context {spec.model.context_len}, batch {batch}")
    rows = [("weights (fp32)", mb(m.weights)), ("gradients (fp32)", mb(m.grads)),
            ("optimizer state", f"adamw {mb(m.adamw)} · adamw8bit {mb(m.adamw8bit)}"),
            ("activations", f"{mb(m.activations_per_sequence)} per sequence · {mb(m.activations(batch))} at batch "
                            f"{batch} · checkpointed {mb(m.checkpointed_per_sequence)} per sequence"),
            ("training step peak", f"adamw {mb(m.device_bytes(batch, 'adamw'))} · adamw8bit "
                                   f"{mb(m.device_bytes(batch, 'adamw8bit'))} (incl. backward workspace)"),
            ("host memory", f"{mb(m.host_bytes)} (outer state: anchor, momentum, feedback, a round in flight)")]
    for name, value in rows:
        click.echo(f"  {name:20s} {value}")
    click.echo(f"budget {mb(budget)} ({budget / 1e9:,.2f} GB) on {device} (90 % usable):")
    found = fits(m, batch, budget)
    for f in found:
        how = "the whole batch at once" if f.accumulation == 1 else f"{f.accumulation} micro-batches accumulated"
        how += ", activation checkpointing" if f.checkpointing else ""
        click.echo(f"  {f.optimizer:10s} micro-batch {f.micro_batch} ({how}): {mb(f.device_bytes)}")
    if not found:
        click.echo("  nothing fits, even one sequence per micro-batch with checkpointing and 8-bit state: choose a "
                   "smaller spec (width, layers per module, context) or a device with more memory")
        raise SystemExit(1)


@node.command("run")
@click.option("--swarm", "spec_path", default=None,
              help="The swarm's spec (TOML), or 'public' for the public swarm listed in bootstrap/public_swarm.toml.")
@click.option("--join", "join_id", default=None,
              help="Join the swarm with this id (what `pathswarm bootstrap` prints): its spec is fetched from "
                   "the initial peers and checked against the id.")
@click.option("--initial-peer", "initial_peers", multiple=True,
              help="Multiaddr of a swarm peer to join through (repeat for several; none: start a new DHT).")
@click.option("--membership", "membership_file", type=click.Path(dir_okay=False), default=None,
              help="Membership certificate of a private swarm (from `pathswarm swarm invite`).")
@click.option("--identity", type=click.Path(dir_okay=False), default=None,
              help="Identity file, fixing the peer id (default with --membership: the one `pathswarm node id` "
                   "shows; otherwise a fresh identity per run).")
@click.option("--path", default="auto", show_default=True,
              help="'auto' claims the least-served path; or a path like 0.1 (one module index per level).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="auto uses CUDA when present.")
@click.option("--data", "data_dir", type=click.Path(file_okay=False), default=None,
              help="Train on this directory's .txt/.jsonl documents instead of the spec's corpus.")
@click.option("--host-maddr", "host_maddrs", multiple=True, default=("/ip4/127.0.0.1/tcp/0",), show_default=True,
              help="Where to listen, e.g. /ip4/0.0.0.0/tcp/31337 to accept peers from other machines.")
@click.option("--announce-maddr", "announce_maddrs", multiple=True,
              help="Address other machines reach this node at, e.g. /ip4/203.0.113.7/tcp/31337 (a port forwarded "
                   "by a home router to the --host-maddr port).")
@click.option("--checkpoint-dir", type=click.Path(file_okay=False), default=None,
              help="Checkpoint root: resumed from at start, written after every round.")
@click.option("--init", "init_dir", type=click.Path(file_okay=False, exists=True), default=None,
              help="A warm-started swarm's round-0 weights (written by `swarm init --warm-start-steps`), checked "
                   "against the spec. Without it such a swarm's round 0 is downloaded from a peer and checked.")
@click.option("--ready-file", type=click.Path(dir_okay=False), default=None,
              help="Write JSON (peer id, multiaddrs, path) here once the node is training.")
@click.option("--status-file", type=click.Path(dir_okay=False), default=None,
              help="Rewrite a JSON of the node's progress here after every round.")
@click.option("--max-rounds", type=int, default=0, show_default=True, help="Stop after N outer rounds (0: never).")
@click.option("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of this node's data stream.")
@click.option("--wait-peers", type=int, default=0, show_default=True,
              help="Before training, wait up to 2 minutes until this many nodes (us included) have claimed paths.")
@click.option("--offline", is_flag=True,
              help="Train the very same loop with networking switched off (a baseline for benchmarks).")
@click.option("--sync-rounds", is_flag=True,
              help="Benchmark baseline: every round waits for every node that ever held the module (a dead one "
                   "until it returns or the round times out), training waits for the round, and a round in which "
                   "a member dies fails for all, who redo its steps, as synchronous data-parallel training does.")
@click.option("--max-tokens-per-s", type=float, default=0.0, show_default=True,
              help="Cap this node's training speed (0: no cap), e.g. to keep a shared machine responsive.")
@click.option("--save-partial-s", type=float, default=2.0, show_default=True,
              help="With --checkpoint-dir, save the round in progress this often (at most; saving never takes "
                   "over 2%% of training time), so a crash or a stop loses seconds of training, not the round. "
                   "0: never.")
@click.option("--audit-rate", type=float, default=0.2, show_default=True,
              help="Audit a round another peer reduced with probability RATE / group size: download the frames it "
                   "merged and recompute its mean, so a lying reducer is caught (docs/SECURITY.md). With every "
                   "member at 0.2 a group audits one round in five. 0: never audit.")
@click.option("--serve-state-mbps", type=float, default=0.0, show_default=True,
              help="Cap, in megabits per second, on the upload of module states this node serves to joining and "
                   "re-syncing peers, so that a home uplink keeps room for the node's own rounds (joiners download "
                   "a state's parts from all its holders at once). 0: no cap. Below 1: a downloader waits for a state "
                   "as if it came at 1 Mbit/s, so a large one served slower may be given up (a warning says so).")
@click.option("--optimizer", type=click.Choice(["adamw", "adamw8bit"]), default=None,
              help="This node's inner optimizer (default: the spec's [inner] optimizer). adamw8bit keeps "
                   "bitsandbytes' 8-bit moments: about a quarter of AdamW's optimizer memory. Only this node's "
                   "inner steps change; its peers may use either.")
@click.option("--reachability", type=click.Choice(["auto", "public", "client"]), default="auto", show_default=True,
              help="auto: ask a peer to dial this node back, and run as a client if it cannot (behind a home router "
                   "without a forwarded port: it trains and contributes to every round, but never reduces one nor "
                   "serves state). public: serve without asking. client: never expect to be dialed.")
@click.option("--dashboard", "dashboard_port", type=click.IntRange(0, 65535), default=None,
              help="Serve a live web page of this node and its swarm (and /metrics for Prometheus) on this port of "
                   "127.0.0.1 (0: any free port; the address is logged).")
@click.option("--dashboard-host", default="127.0.0.1", show_default=True,
              help="Address the dashboard listens on; another than loopback lets other machines read it.")
@friendly
def node_run(spec_path: str | None, join_id: str | None, initial_peers: tuple[str, ...], membership_file: str | None,
             identity: str | None, path: str, device: str, data_dir: str | None,
             host_maddrs: tuple[str, ...], announce_maddrs: tuple[str, ...], checkpoint_dir: str | None,
             init_dir: str | None, ready_file: str | None,
             status_file: str | None, max_rounds: int, threads: int, seed: int, wait_peers: int,
             offline: bool, sync_rounds: bool, max_tokens_per_s: float, save_partial_s: float,
             audit_rate: float, serve_state_mbps: float, optimizer: str | None, reachability: str,
             dashboard_port: int | None,
             dashboard_host: str) -> None:
    """Join a swarm, claim a path, sync its modules and train until stopped (Ctrl-C leaves cleanly).

    \b
    pathswarm node run --swarm swarm.toml                      # start a new swarm from a spec
    pathswarm node run --join ID --initial-peer ADDR           # join: the spec comes from the swarm
    pathswarm node run --swarm public                          # join the public swarm
    pathswarm node run --join ID --initial-peer ADDR --membership member.cert   # a private swarm
    """
    if max_rounds < 0:  # checked before the import below (torch, hivemind: seconds): a typo fails at once
        raise click.BadParameter("must be >= 0", param_hint="--max-rounds")
    for value, hint in ((max_tokens_per_s, "--max-tokens-per-s"), (save_partial_s, "--save-partial-s"),
                        (audit_rate, "--audit-rate"), (serve_state_mbps, "--serve-state-mbps")):
        if not value >= 0 or value == float("inf"):
            raise click.BadParameter("must be a finite number >= 0", param_hint=hint)
    if 0 < serve_state_mbps < 1:  # protocol/rounds/state_parts.py FLOOR_BYTES_PER_S: 1 Mbit/s
        click.echo(f"warning: --serve-state-mbps {serve_state_mbps:g}: peers wait for a state as if it came at "
                   "1 Mbit/s at least; a large state served slower may be given up and asked of another holder",
                   err=True)
    spec, initial_peers = resolve_swarm(spec_path, join_id, tuple(initial_peers))
    if path != "auto":  # before the DHT starts: a wrong path used to be refused some 17 s later
        from pathswarm.protocol.spec import parse_path
        try:
            parse_path(path, spec)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--path") from None
    identity_path, membership = resolve_identity(identity, membership_file, spec)
    from pathswarm.node.peer.node import Node, NodeConfig

    cfg = NodeConfig(spec=spec, initial_peers=tuple(initial_peers), path=path,
                     identity_path=identity_path, membership=membership, device=device, data_dir=data_dir or "",
                     host_maddrs=tuple(host_maddrs), announce_maddrs=tuple(announce_maddrs),
                     checkpoint_dir=checkpoint_dir or "", init_dir=init_dir or "", ready_file=ready_file or "",
                     status_file=status_file or "", max_rounds=max_rounds, threads=threads, seed=seed,
                     wait_peers=wait_peers, offline=offline, sync_rounds=sync_rounds,
                     max_tokens_per_s=max_tokens_per_s, partial_every_s=save_partial_s,
                     audit_rate=audit_rate, serve_state_mbps=serve_state_mbps, optimizer=optimizer or "",
                     reachability=reachability)
    n = Node(cfg, handle_signals=True)
    board = None
    if dashboard_port is not None:  # bound before joining: a port in use fails at once
        from pathswarm.node.app.dashboard.run import check_host, node_poll, swarm_poll
        from pathswarm.node.app.dashboard.server import Dashboard
        from pathswarm.node.app.dashboard.view import DashboardState

        check_host(dashboard_host)
        board = Dashboard(DashboardState(spec), swarm_poll(spec, lambda: n.sdht), dashboard_host, dashboard_port,
                          node=node_poll(n.status)).start()
        click.echo(f"dashboard at {board.url}", err=True)
    try:
        code = run_with_display(n) if sys.stderr.isatty() else n.run()
    finally:
        if board is not None:
            board.stop()
    sys.exit(code)


@click.command()
@click.option("--swarm", "spec_path", default=None, help="The swarm's spec (TOML).")
@click.option("--join", "join_id", default=None,
              help="Or the swarm id: a further bootstrap peer of a running swarm fetches the spec from it.")
@click.option("--initial-peer", "initial_peers", multiple=True,
              help="Another bootstrap peer of the same swarm to connect to (repeat; several may serve one swarm).")
@click.option("--host-maddr", "host_maddrs", multiple=True, default=("/ip4/127.0.0.1/tcp/0",), show_default=True,
              help="Where to listen, e.g. /ip4/0.0.0.0/tcp/31337 for peers on other machines.")
@click.option("--announce-maddr", "announce_maddrs", multiple=True,
              help="Address other machines reach this peer at, e.g. /ip4/203.0.113.7/tcp/31337 (port forwarding).")
@click.option("--ready-file", type=click.Path(dir_okay=False), default=None,
              help="Write JSON (peer id, multiaddrs) here once the peer is up.")
@click.option("--identity", type=click.Path(dir_okay=False), default=None,
              help="RSA identity file, created with mode 0600 if missing (default: one per swarm in "
                   "~/.local/share/pathswarm/identities/). Keeps the peer id, hence the address, across restarts.")
@friendly
def bootstrap(spec_path: str | None, join_id: str | None, initial_peers: tuple[str, ...], host_maddrs: tuple[str, ...],
              announce_maddrs: tuple[str, ...], ready_file: str | None, identity: str | None) -> None:
    """Run a DHT-only peer that nodes join the swarm through (trains nothing); it prints the join command."""
    spec, initial_peers = resolve_swarm(spec_path, join_id, tuple(initial_peers))
    sys.exit(run_bootstrap(spec, list(host_maddrs), ready_file or "", identity=identity,
                           initial_peers=tuple(initial_peers), announce_maddrs=tuple(announce_maddrs)))
