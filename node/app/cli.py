"""The `pathswarm` command line (click): parses options, sets up logging, calls the library.

Every user-facing failure (bad spec, missing data, corrupt checkpoint, bad option value) is one line
on stderr and exit code 2; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path

import click

from pathswarm import __version__
from pathswarm.jsonfile import write_json_atomic
from pathswarm.protocol.spec import SpecError, SwarmSpec, load_spec

EXIT_USAGE = 2


def _user_errors() -> tuple[type[BaseException], ...]:
    from pathswarm.node.model.data import DataError
    from pathswarm.node.train.checkpoint import CheckpointError

    return (SpecError, CheckpointError, DataError, ValueError, OSError)


def friendly(fn: Callable) -> Callable:
    """Turn expected failures into one clear line and exit code 2 (traceback only with --debug)."""

    @wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except _user_errors() as e:
            ctx = click.get_current_context()
            if ctx.find_root().obj and ctx.find_root().obj.get("debug"):
                raise
            click.echo(f"error: {e}", err=True)
            sys.exit(EXIT_USAGE)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)

    return wrapper


def _load_spec_option(path: str) -> SwarmSpec:
    return load_spec(path)


def _write_json(path: str | None, payload: dict) -> None:
    if path:
        write_json_atomic(path, payload, sort_keys=True)
        click.echo(f"wrote {path}")


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="pathswarm")
@click.option("--debug", is_flag=True, help="Show full tracebacks and debug logs.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """pathswarm: train one modular language model (DiPaCo) with strangers' GPUs, peer to peer.

    \b
    Typical use:
      pathswarm swarm init -o swarm.toml          # define a swarm and fit its router
      pathswarm simulate --spec swarm.toml        # run the algorithm in one process
      pathswarm eval --spec swarm.toml --checkpoint DIR
      pathswarm demo                              # the quickstart: a short local swarm
    """
    ctx.obj = {"debug": debug}
    logging.basicConfig(level=logging.DEBUG if debug else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")


# ---- swarm ---------------------------------------------------------------------------------------
@main.group()
def swarm() -> None:
    """Create and inspect swarm specs."""


def _parse_levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(x) for x in text.lower().split("x"))
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected modules per level like 2x2 or 4x2x2") from None
    if not levels or any(k <= 0 for k in levels):
        raise click.BadParameter(f"{text!r}: every level needs at least one module")
    return levels


@swarm.command("init")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Where to write the spec (TOML).")
@click.option("--corpus", type=click.Choice(["bbc", "synthetic"]), default="bbc", show_default=True,
              help="Built-in corpus the router is fitted on (ignored with --data).")
@click.option("--data", "data_dir", type=click.Path(file_okay=False), default=None,
              help="Directory of .txt / .jsonl documents to use instead of a built-in corpus.")
@click.option("--levels", default="2x2", show_default=True, help="Modules per level, e.g. 2x2 (4 paths) or 4x2.")
@click.option("--width", type=int, default=128, show_default=True, help="Model width (d_model) of every module.")
@click.option("--base-width", type=int, default=64, show_default=True,
              help="Width the hyperparameters were tuned at (muP scales from it).")
@click.option("--heads", type=int, default=4, show_default=True, help="Attention heads (must divide --width).")
@click.option("--layers-per-module", type=int, default=2, show_default=True, help="Transformer blocks per module.")
@click.option("--context-len", type=int, default=128, show_default=True, help="Tokens (bytes) per sequence.")
@click.option("--inner-steps", type=int, default=50, show_default=True, help="H: inner AdamW steps per outer round.")
@click.option("--inner-lr", type=float, default=3e-3, show_default=True,
              help="Inner AdamW learning rate at base width.")
@click.option("--name", default="pathswarm", show_default=True, help="Swarm name (part of its id).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the router fit and the initial weights.")
@click.option("--force", is_flag=True, help="Overwrite an existing output file.")
@click.option("--private", is_flag=True,
              help="Only peers holding a membership certificate from you may join: creates your owner key "
                   "(mode 0600, in ~/.local/share/pathswarm/owners/) and puts its public half in the spec.")
@click.option("--owner-key", type=click.Path(dir_okay=False), default=None,
              help="With --private: write the owner key here instead (never overwritten; keep it out of the repo).")
@friendly
def swarm_init(output: str, corpus: str, data_dir: str | None, levels: str, width: int, base_width: int, heads: int,
               layers_per_module: int, context_len: int, inner_steps: int, inner_lr: float, name: str, seed: int,
               force: bool, private: bool, owner_key: str | None) -> None:
    """Define a new swarm: build a spec, fit the document router, print paths and routing."""
    from pathswarm.node.app.swarm_init import format_init_report, init_spec
    from pathswarm.node.model.data import load_documents
    from pathswarm.protocol.spec import DataSpec, InnerOptSpec, ModelSpec, RouterSpec

    out = Path(output)
    if out.exists() and not force:
        raise click.UsageError(f"{out} exists; pass --force to overwrite it")
    data = DataSpec(corpus="dir", path=str(Path(data_dir).resolve())) if data_dir else DataSpec(corpus=corpus)
    base = SwarmSpec(
        name=name, levels=_parse_levels(levels),
        model=ModelSpec(width=width, base_width=base_width, n_heads=heads, layers_per_module=layers_per_module,
                        context_len=context_len, seed=seed),
        router=RouterSpec(seed=seed), inner=InnerOptSpec(steps=inner_steps, lr=inner_lr), data=data)
    if owner_key and not private:
        raise click.UsageError("--owner-key goes with --private")
    docs = load_documents(base.data)
    spec = init_spec(base, docs)
    key_path = None
    if private:
        from pathswarm.protocol.identity import default_owner_key
        from pathswarm.protocol.membership import Ed25519PrivateKey, public_key_text, save_owner_key
        from pathswarm.protocol.spec import MembershipSpec

        key = Ed25519PrivateKey.generate()
        spec = spec.replace(membership=MembershipSpec(owner_key=public_key_text(key)))
        key_path = Path(owner_key) if owner_key else default_owner_key(spec.membership.owner_key)
        save_owner_key(key, key_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(spec.to_toml(), encoding="utf-8")
    click.echo(format_init_report(spec, docs))
    click.echo(f"wrote {out} (swarm id {spec.swarm_id})")
    if key_path:
        click.echo(f"private swarm: owner key {key_path} (mode 0600; back it up, never share it). Admit a node "
                   f"with: pathswarm swarm invite --swarm {out} --peer-id ID -o member.cert")


@swarm.command("id")
@click.argument("spec_path", type=click.Path(dir_okay=False))
@friendly
def swarm_id(spec_path: str) -> None:
    """Print the swarm id (sha256 of the canonical spec) of SPEC_PATH."""
    click.echo(_load_spec_option(spec_path).swarm_id)


@swarm.command("invite")
@click.option("--swarm", "spec_path", required=True, type=click.Path(dir_okay=False), help="The private swarm's spec.")
@click.option("--peer-id", required=True, help="The node's peer id (it prints it with `pathswarm node id`).")
@click.option("--expires", default="90d", show_default=True,
              help="How long the membership lasts: 30d, 12h, 90m, or a date like 2027-06-30 (UTC).")
@click.option("--owner-key", type=click.Path(dir_okay=False), default=None,
              help="The owner key (default: the one `swarm init --private` wrote for this spec).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write the certificate here (default: print it).")
@friendly
def swarm_invite(spec_path: str, peer_id: str, expires: str, owner_key: str | None, output: str | None) -> None:
    """Admit one node to a private swarm: sign a membership certificate for its peer id."""
    import time as _time

    from pathswarm.protocol.identity import default_owner_key
    from pathswarm.protocol.membership import issue, load_owner_key, parse_expiry, public_key_text

    spec = _load_spec_option(spec_path)
    if not spec.membership.private:
        raise ValueError(f"{spec_path} is an open swarm (no membership.owner_key): anyone may join it; "
                         "create a private one with `pathswarm swarm init --private`")
    key_path = Path(owner_key) if owner_key else default_owner_key(spec.membership.owner_key)
    key = load_owner_key(key_path)
    if public_key_text(key) != spec.membership.owner_key:
        raise ValueError(f"{key_path} is not the owner key of {spec_path} (its public key differs from the spec's)")
    cert = issue(key, spec.swarm_id, peer_id.strip(), parse_expiry(expires))
    when = _time.strftime("%Y-%m-%d %H:%M UTC", _time.gmtime(cert.expires_at))
    if output:
        Path(output).write_text(cert.token + "\n", encoding="ascii")
        click.echo(f"wrote {output}: peer {cert.peer_id} may join swarm {spec.name!r} until {when}")
    else:
        click.echo(cert.token)
        click.echo(f"(peer {cert.peer_id} may join swarm {spec.name!r} until {when})", err=True)


@swarm.command("status")
@click.option("--swarm", "spec_path", type=str, default=None,
              help="The swarm's spec (TOML), or 'public'.")
@click.option("--join", "join_id", default=None, help="Or the swarm id (the spec is fetched from the swarm).")
@click.option("--initial-peer", "initial_peers", multiple=True,
              help="Multiaddr of a peer of the swarm (repeat for several).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Also write JSON here.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Write a PNG of each path's training loss over the last rounds here.")
@friendly
def swarm_status(spec_path: str | None, join_id: str | None, initial_peers: tuple[str, ...], json_path: str | None,
                 plot_path: str | None) -> None:
    """Paths (who serves each, tokens/s, round, loss), modules (round, holders, replica agreement), totals.

    Read from the records the swarm's nodes publish in the DHT (also in a private swarm: records are
    signed and validated, not secret; module weights are served only to members)."""
    from rich.console import Console
    from rich.table import Table

    from pathswarm.node.peer.joining import resolve_swarm
    from pathswarm.protocol.swarm_view import collect_view, summarize

    spec, initial_peers = resolve_swarm(spec_path, join_id, initial_peers)
    if not initial_peers:
        raise click.UsageError("--initial-peer is required: the address of any peer of the swarm")
    sdht = _start_client_or_explain(spec, initial_peers)
    try:
        summary = summarize(spec, collect_view(sdht, spec))
    finally:
        sdht.shutdown()
    console = Console()
    t = Table(title=f"swarm {spec.name} ({spec.swarm_id[:12]}…): paths")
    for col in ("path", "nodes", "tokens/s", "round", "loss"):
        t.add_column(col, justify="right")
    for p in summary["paths"]:
        t.add_row(p["path"], str(len(p["nodes"])), f"{p['tokens_per_s']:,.0f}", str(p["last_round"] or "-"),
                  f"{p['loss']:.4f}" if p["loss"] is not None else "-")
    console.print(t)
    t = Table(title="modules")
    for col in ("module", "round", "holders", "at that round", "replicas agree"):
        t.add_column(col, justify="right")
    for m in summary["modules"]:
        agree = {True: "yes", False: "NO", None: "-"}[m["replicas_agree"]]
        t.add_row(m["module"], str(m["round"] if m["round"] is not None else "-"), str(m["holders"]),
                  str(m["holders_at_round"]), agree)
    console.print(t)
    tot = summary["totals"]
    console.print(f"{tot['nodes']} nodes · {tot['paths_served']}/{spec.n_paths} paths served · "
                  f"{tot['tokens_per_s']:,.0f} tokens/s · sent {tot['bytes_sent']:,} B")
    _write_json(json_path, summary)
    if plot_path:
        from pathswarm.node.app.fmt import plot_path_history

        plot_path_history(summary, plot_path)
        click.echo(f"wrote {plot_path}")


def _start_client_or_explain(spec: SwarmSpec, initial_peers: tuple[str, ...]):
    """A DHT client of the swarm; a NetStartError (a ValueError: one line) says why it did not start."""
    from pathswarm.protocol.net import start_net

    return start_net(list(initial_peers), spec=spec, client_mode=True)


# ---- simulate ------------------------------------------------------------------------------------
@main.command()
@click.option("--spec", "spec_path", required=True, type=click.Path(dir_okay=False), help="Swarm spec (TOML).")
@click.option("--mode", type=click.Choice(["dipaco", "diloco", "sync"]), default="dipaco", show_default=True,
              help="dipaco: one worker per path on routed data; diloco: N replicas of one path; "
                   "sync: data-parallel baseline with gradients averaged every step.")
@click.option("--workers", type=int, default=0, help="Workers (default: one per path for dipaco, 4 otherwise).")
@click.option("--rounds", type=int, default=5, show_default=True, help="Outer rounds.")
@click.option("--inner-steps", type=int, default=0, help="H inner steps per round (default: the spec's).")
@click.option("--lr", type=float, default=0.0, help="Override the spec's inner learning rate.")
@click.option("--eval-batches", type=int, default=8, show_default=True, help="Validation batches per path.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the workers' data streams.")
@click.option("--checkpoint-dir", type=click.Path(file_okay=False), default=None,
              help="Write the final modules here (readable by eval and generate).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write per-round losses, tokens and bytes as JSON.")
@friendly
def simulate(spec_path: str, mode: str, workers: int, rounds: int, inner_steps: int, lr: float, eval_batches: int,
             seed: int, checkpoint_dir: str | None, json_path: str | None) -> None:
    """Run the whole training algorithm in one process, without networking."""
    from pathswarm.node.app.progress import run_with_progress
    from pathswarm.node.train.simulate import SimConfig

    spec = _load_spec_option(spec_path)
    cfg = SimConfig(mode=mode, workers=workers, rounds=rounds, inner_steps=inner_steps, lr=lr,
                    eval_batches=eval_batches, seed=seed, checkpoint_dir=checkpoint_dir or "")
    result = run_with_progress(spec, cfg)
    _write_json(json_path, result.to_json())


# ---- node ----------------------------------------------------------------------------------------
@main.group()
def node() -> None:
    """Run a training node."""


@node.command("id")
@click.option("--identity", type=click.Path(dir_okay=False), default=None,
              help="Identity file (default: ~/.local/share/pathswarm/identities/node.key, created if missing).")
@friendly
def node_id(identity: str | None) -> None:
    """Print this node's peer id: what the owner of a private swarm needs to invite it."""
    from pathswarm.protocol.identity import default_node_identity, ensure_identity, peer_id_of_identity

    path = ensure_identity(Path(identity) if identity else default_node_identity())
    click.echo(peer_id_of_identity(path))
    click.echo(f"(identity {path})", err=True)


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
@click.option("--checkpoint-dir", type=click.Path(file_okay=False), default=None,
              help="Checkpoint root: resumed from at start, written after every round.")
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
@friendly
def node_run(spec_path: str | None, join_id: str | None, initial_peers: tuple[str, ...], membership_file: str | None,
             identity: str | None, path: str, device: str, data_dir: str | None,
             host_maddrs: tuple[str, ...], checkpoint_dir: str | None, ready_file: str | None,
             status_file: str | None, max_rounds: int, threads: int, seed: int, wait_peers: int,
             offline: bool, sync_rounds: bool, max_tokens_per_s: float, save_partial_s: float) -> None:
    """Join a swarm, claim a path, sync its modules and train until stopped (Ctrl-C leaves cleanly).

    \b
    pathswarm node run --swarm swarm.toml                      # start a new swarm from a spec
    pathswarm node run --join ID --initial-peer ADDR           # join: the spec comes from the swarm
    pathswarm node run --swarm public                          # join the public swarm
    pathswarm node run --join ID --initial-peer ADDR --membership member.cert   # a private swarm
    """
    if max_rounds < 0:  # checked before the imports below (torch, hivemind: seconds): a typo fails at once
        raise click.BadParameter("must be >= 0", param_hint="--max-rounds")
    for value, hint in ((max_tokens_per_s, "--max-tokens-per-s"), (save_partial_s, "--save-partial-s")):
        if not value >= 0 or value == float("inf"):
            raise click.BadParameter("must be a finite number >= 0", param_hint=hint)
    from pathswarm.node.peer.joining import resolve_identity, resolve_swarm
    from pathswarm.node.peer.node import Node, NodeConfig

    spec, initial_peers = resolve_swarm(spec_path, join_id, tuple(initial_peers))
    identity_path, membership = resolve_identity(identity, membership_file, spec)
    cfg = NodeConfig(spec=spec, initial_peers=tuple(initial_peers), path=path,
                     identity_path=identity_path, membership=membership, device=device, data_dir=data_dir or "",
                     host_maddrs=tuple(host_maddrs),
                     checkpoint_dir=checkpoint_dir or "", ready_file=ready_file or "",
                     status_file=status_file or "", max_rounds=max_rounds, threads=threads, seed=seed,
                     wait_peers=wait_peers, offline=offline, sync_rounds=sync_rounds,
                     max_tokens_per_s=max_tokens_per_s, partial_every_s=save_partial_s)
    n = Node(cfg, handle_signals=True)
    if sys.stderr.isatty():
        from pathswarm.node.app.node_display import run_with_display

        sys.exit(run_with_display(n))
    sys.exit(n.run())


@main.command()
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
    from pathswarm.bootstrap.peer import run_bootstrap
    from pathswarm.node.peer.joining import resolve_swarm

    spec, initial_peers = resolve_swarm(spec_path, join_id, tuple(initial_peers))
    sys.exit(run_bootstrap(spec, list(host_maddrs), ready_file or "", identity=identity,
                           initial_peers=tuple(initial_peers), announce_maddrs=tuple(announce_maddrs)))


# ---- demo ----------------------------------------------------------------------------------------
@main.command()
@click.option("--nodes", type=int, default=4, show_default=True, help="Node processes to start (one per path of 2x2).")
@click.option("--rounds", type=int, default=4, show_default=True, help="Outer rounds each node trains.")
@click.option("--inner-steps", type=int, default=40, show_default=True, help="H inner steps per round.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="runs/demo", show_default=True,
              help="Directory for the spec, logs, checkpoints, JSON and plot.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="JSON summary path (default: OUT/demo.json).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="PNG of loss curves per node and path (default: OUT/demo.png).")
@click.option("--simulated", is_flag=True, help="Run the same algorithm in one process, without networking.")
@friendly
def demo(nodes: int, rounds: int, inner_steps: int, out_dir: str, json_path: str | None, plot_path: str | None,
         simulated: bool) -> None:
    """A real local swarm: a bootstrap peer and N nodes on 127.0.0.1 train a 2x2 DiPaCo model on BBC News."""
    from pathswarm.node.app import demo as demo_mod

    if nodes <= 0 or rounds <= 0 or inner_steps <= 0:
        raise click.BadParameter("--nodes, --rounds and --inner-steps must be positive")
    json_p, plot_p = (Path(json_path) if json_path else None), (Path(plot_path) if plot_path else None)
    if simulated:
        demo_mod.run_simulated_demo(rounds=rounds, inner_steps=inner_steps, out_dir=Path(out_dir), json_path=json_p,
                                    plot_path=plot_p)
    else:
        demo_mod.run_demo(nodes=nodes, rounds=rounds, inner_steps=inner_steps, out_dir=Path(out_dir),
                          json_path=json_p, plot_path=plot_p)


# ---- inference -----------------------------------------------------------------------------------
@main.command("eval")
@click.option("--spec", "spec_path", required=True, type=click.Path(dir_okay=False), help="Swarm spec (TOML).")
@click.option("--checkpoint", "checkpoint_dir", required=True, type=click.Path(), help="Checkpoint directory.")
@click.option("--batches", type=int, default=16, show_default=True, help="Validation batches per path.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Also write JSON here.")
@friendly
def eval_cmd(spec_path: str, checkpoint_dir: str, batches: int, json_path: str | None) -> None:
    """Routed validation loss (and bits per byte) per path and overall."""
    from rich.console import Console
    from rich.table import Table

    from pathswarm.node.train.checkpoint import load_checkpoint
    from pathswarm.node.train.evaluate import routed_eval

    spec = _load_spec_option(spec_path)
    ckpt = load_checkpoint(checkpoint_dir, spec)
    rows, overall = routed_eval(spec, ckpt, max_batches=batches)
    table = Table(title=f"routed validation loss, round {ckpt.round}")
    for col in ("path", "documents", "tokens", "loss (nats)", "bits/byte"):
        table.add_column(col, justify="right")
    for r in [*rows, overall]:
        table.add_row(r.path, str(r.documents), str(r.tokens), f"{r.loss:.4f}", f"{r.bits_per_byte:.4f}")
    Console().print(table)
    _write_json(json_path, {"round": ckpt.round, "paths": {r.path: r.loss for r in rows}, "all": overall.loss,
                            "bits_per_byte": overall.bits_per_byte})


@main.command()
@click.option("--spec", "spec_path", required=True, type=click.Path(dir_okay=False), help="Swarm spec (TOML).")
@click.option("--checkpoint", "checkpoint_dir", required=True, type=click.Path(), help="Checkpoint directory.")
@click.option("--prompt", required=True, help="Text to continue; it is routed to its path first.")
@click.option("--max-bytes", type=int, default=200, show_default=True, help="Bytes to generate.")
@click.option("--temperature", type=float, default=0.8, show_default=True, help="Sampling temperature (0: greedy).")
@click.option("--seed", type=int, default=0, show_default=True, help="Sampling seed.")
@friendly
def generate(spec_path: str, checkpoint_dir: str, prompt: str, max_bytes: int, temperature: float, seed: int) -> None:
    """Route PROMPT to its path and sample a continuation."""
    from pathswarm.node.train.evaluate import generate_text

    if max_bytes <= 0:
        raise click.BadParameter("must be positive", param_hint="--max-bytes")
    spec = _load_spec_option(spec_path)
    path, text = generate_text(spec, checkpoint_dir, prompt, max_bytes, temperature, seed)
    click.echo(f"[path {path}] {prompt}{text}")


def _register_tune() -> None:
    from pathswarm.node.train.tune import tune_command

    main.add_command(tune_command, "tune")


_register_tune()


if __name__ == "__main__":  # pragma: no cover
    main()
