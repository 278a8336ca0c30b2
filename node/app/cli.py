"""The `pathswarm` command line (click): parses options, sets up logging, calls the library.

This file holds the root group and the `swarm` commands that create a swarm and manage its members (init, id,
invite, revoke); the others live by concern in node/app/cli_swarm_view.py (swarm status, swarm dashboard),
node/app/cli_node.py (run a peer), node/app/cli_model.py (simulate, demo, eval, generate) and
node/app/cli_tune.py (tune). What they share, one line and exit code 2 for every user-facing
failure, is node/app/cli_common.py.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import click

from pathswarm import __version__
from pathswarm.logs import LEVELS, level_of, setup_logging
from pathswarm.node.app.cli_common import friendly, load_spec_option
from pathswarm.node.app.cli_model import demo, eval_cmd, generate, simulate
from pathswarm.node.app.cli_node import bootstrap, node
from pathswarm.node.app.cli_swarm_view import swarm_dashboard, swarm_status
from pathswarm.node.app.cli_tune import tune_command
from pathswarm.node.app.cli_whole_model import model_group
from pathswarm.protocol.identity import default_owner_key
from pathswarm.protocol.membership import (
    Ed25519PrivateKey,
    issue,
    load_owner_key,
    owner_key_encrypted,
    parse_expiry,
    public_key_text,
    save_owner_key,
    sign_revocations,
    verify_revocations,
)
from pathswarm.protocol.spec import (
    AveragingSpec,
    DataSpec,
    InnerOptSpec,
    MembershipSpec,
    ModelSpec,
    OuterOptSpec,
    RouterSpec,
    SwarmSpec,
)
from pathswarm.protocol.spec_sections import MAX_SLICES

PASSPHRASE_ENV = "PATHSWARM_OWNER_PASSPHRASE"
"""Where `swarm init --passphrase`, `swarm invite` and `swarm revoke` take an owner key's passphrase from, if set."""

# Imported inside the commands that need them, after the checks of their options, so that `pathswarm --help` and a
# mistyped option answer at once; measured (python -X importtime, min of 15) on top of what `--help` loads anyway
# (~200 ms in all): swarm_init and node/model/data.py import torch, ~1.8 s; protocol/swarm_view.py the pydantic
# records, ~90 ms; protocol/net/ hivemind, ~2.8 s. rich (~20 ms, in cli_swarm_view.py) and protocol/membership.py
# (cryptography, ~19 ms) cost less than `--help`'s own run-to-run spread, so they are imported at the top.


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="pathswarm")
@click.option("--debug", is_flag=True, help="Show full tracebacks and debug logs.")
@click.option("-v", "--verbose", count=True, help="More log lines (-v: debug).")
@click.option("-q", "--quiet", count=True, help="Fewer log lines (-q: warnings and errors only, -qq: errors only).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
              default=None, help="The log level outright (instead of -v / -q); hivemind's own logs follow it too.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default=None,
              help="text (the default) or json: one JSON object per line (time, level, logger, message), for log "
                   "collectors. Both options also read $PATHSWARM_LOG_LEVEL and $PATHSWARM_LOG_FORMAT, which this "
                   "command sets for the processes it starts (a local swarm's nodes).")
@click.pass_context
def main(ctx: click.Context, debug: bool, verbose: int, quiet: int, log_level: str | None,
         log_format: str | None) -> None:
    """pathswarm: train one modular language model (DiPaCo) with strangers' GPUs, peer to peer.

    \b
    Typical use:
      pathswarm swarm init -o swarm.toml          # define a swarm and fit its router
      pathswarm simulate --spec swarm.toml        # run the algorithm in one process
      pathswarm eval --spec swarm.toml --checkpoint DIR
      pathswarm demo                              # the quickstart: a short local swarm
    """
    ctx.obj = {"debug": debug}
    inherited = os.environ.get("PATHSWARM_LOG_LEVEL", "").lower()
    if not (verbose or quiet or log_level) and inherited in LEVELS:
        log_level = inherited
    level = logging.DEBUG if debug else level_of(verbose, quiet, log_level)
    log_format = log_format or ("json" if os.environ.get("PATHSWARM_LOG_FORMAT") == "json" else "text")
    setup_logging(level, log_format)
    # Processes this one starts (a local swarm's nodes, the demo's) log the same way: they read these.
    os.environ["PATHSWARM_LOG_LEVEL"] = logging.getLevelName(level).lower()
    os.environ["PATHSWARM_LOG_FORMAT"] = log_format


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
@click.option("--inner-steps", type=click.IntRange(min=1), default=None,
              help="H: inner AdamW steps per outer round (default: 50 for one path, 25 for a grid of paths).")
@click.option("--outer-lr", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Outer Nesterov learning rate (default: 0.7 for one path, 0.5 for a grid: measured, see "
                   "docs/BENCHMARKS.md, 'Does it learn?'; half of that with --eager).")
@click.option("--inner-lr", type=float, default=3e-3, show_default=True,
              help="Inner AdamW learning rate at base width.")
@click.option("--name", default="pathswarm", show_default=True, help="Swarm name (part of its id).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the router fit and the initial weights.")
@click.option("--slices", type=click.IntRange(1, MAX_SLICES), default=1, show_default=True,
              help="Cut each module's outer round into up to this many slices, each reduced by another member, so "
                   "that no node's traffic grows with the group (1: one reducer per module and round). For a swarm "
                   "of many nodes on home links: 16 (docs/HOW_IT_WORKS.md, 'Many nodes').")
@click.option("--outer", "outer_kind", type=click.Choice(["nesterov", "sparseloco"]), default="nesterov",
              show_default=True,
              help="nesterov: DiLoCo's outer Nesterov on int8 + zstd outer gradients. sparseloco: SparseLoCo (arXiv "
                   "2508.15706): each member sends the top --sparse-percent of its decaying error-feedback buffer at "
                   "2 bits, the mean comes back at 3 bits, a plain outer step: ~100x fewer bytes than fp32 at int8's "
                   "loss after some 300 rounds, behind it early on (docs/BENCHMARKS.md, 'SparseLoCo').")
@click.option("--eager", is_flag=True,
              help="Eager updates (arXiv 2502.12996): at each send a node moves its own weights by the outer step of "
                   "its own outer gradient, so that its next steps do not start a whole outer step behind the mean "
                   "still on its way (nodes train on while a round is open). Only with a smaller outer step: the "
                   "default --outer-lr becomes half the usual one. Measured on one path, H = 10, each mean a chunk "
                   "late: 1.884 at lr 0.35 against 2.088 without (and worse than without at lr 0.7); no gain at "
                   "H = 100 on home links (docs/BENCHMARKS.md). Nesterov only.")
@click.option("--sparse-percent", type=click.FloatRange(0.01, 100), default=1.0, show_default=True,
              help="With --outer sparseloco: the share of each chunk of values a frame carries.")
@click.option("--beta", type=click.FloatRange(0, 1, min_open=True), default=0.99, show_default=True,
              help="With --outer sparseloco: how much of the error-feedback buffer carries into the next round.")
@click.option("--force", is_flag=True, help="Overwrite an existing output file.")
@click.option("--warm-start-steps", type=click.IntRange(min=0), default=0, show_default=True,
              help="Train the whole model this many steps on this machine before publishing it: round 0 becomes "
                   "those weights (their digests go in the spec, so in the swarm id) instead of the seed init. "
                   "Start your node with --init DIR to serve them.")
@click.option("--warm-start-batch", type=click.IntRange(min=0), default=0, show_default=True,
              help="Sequences per warm-start step (0: the spec's inner batch size).")
@click.option("--init-dir", type=click.Path(file_okay=False), default=None,
              help="With --warm-start-steps: where to write the round-0 weights (default: the spec's path with "
                   "the suffix .init, e.g. swarm.init/).")
@click.option("--private", is_flag=True,
              help="Only peers holding a membership certificate from you may join: creates your owner key "
                   "(mode 0600, in ~/.local/share/pathswarm/owners/) and puts its public half in the spec.")
@click.option("--owner-key", type=click.Path(dir_okay=False), default=None,
              help="With --private: write the owner key here instead (never overwritten; keep it out of the repo).")
@click.option("--passphrase", is_flag=True,
              help="With --private: encrypt the owner key with a passphrase (asked twice, or taken from "
                   f"${PASSPHRASE_ENV}); `swarm invite` and `swarm revoke` then ask for it.")
@friendly
def swarm_init(output: str, corpus: str, data_dir: str | None, levels: str, width: int, base_width: int, heads: int,
               layers_per_module: int, context_len: int, inner_steps: int | None, outer_lr: float | None,
               inner_lr: float, name: str, seed: int, slices: int, outer_kind: str, sparse_percent: float,
               eager: bool, beta: float, force: bool, warm_start_steps: int, warm_start_batch: int,
               init_dir: str | None, private: bool, owner_key: str | None, passphrase: bool) -> None:
    """Define a new swarm: build a spec, fit the document router, print paths and routing.

    The spec records when it was written (`created`): peers refuse round numbers later than the swarm's age allows.

    With --warm-start-steps, also train the initial weights here first (DiLoCo's warm start): every node that
    starts from round 0 then checks what it loads or downloads against their digests in the spec."""
    out = Path(output)
    if out.exists() and not force:
        raise click.UsageError(f"{out} exists; pass --force to overwrite it")
    if init_dir and not warm_start_steps:
        raise click.UsageError("--init-dir goes with --warm-start-steps")
    init_out = Path(init_dir) if init_dir else out.with_suffix(".init")
    if warm_start_steps and init_out.exists() and any(init_out.iterdir()) and not force:
        raise click.UsageError(f"{init_out} exists and is not empty; pass --force to overwrite it")
    data = DataSpec(corpus="dir", path=str(Path(data_dir).resolve())) if data_dir else DataSpec(corpus=corpus)
    from pathswarm.node.app.swarm_init import EAGER_LR_SCALE, SPARSELOCO_LR, round_defaults, sparseloco_sections

    parsed_levels = _parse_levels(levels)
    default_h, default_outer_lr = round_defaults(parsed_levels)
    base = SwarmSpec(
        name=name, created=int(time.time()), levels=parsed_levels,
        model=ModelSpec(width=width, base_width=base_width, n_heads=heads, layers_per_module=layers_per_module,
                        context_len=context_len, seed=seed),
        router=RouterSpec(seed=seed), inner=InnerOptSpec(steps=inner_steps or default_h, lr=inner_lr),
        outer=OuterOptSpec(lr=outer_lr or default_outer_lr * (EAGER_LR_SCALE if eager else 1.0), eager=eager),
        data=data, averaging=AveragingSpec(slices=slices))
    if eager and outer_kind != "nesterov":
        raise click.UsageError("--eager goes with --outer nesterov")
    if outer_kind == "sparseloco":
        base = base.replace(**sparseloco_sections(sparse_percent, beta, outer_lr or SPARSELOCO_LR))
    elif sparse_percent != 1.0 or beta != 0.99:
        raise click.UsageError("--sparse-percent and --beta go with --outer sparseloco")
    if (owner_key or passphrase) and not private:
        raise click.UsageError("--owner-key and --passphrase go with --private")
    from pathswarm.node.app.swarm_init import format_init_report, init_spec
    from pathswarm.node.model.data import load_documents

    docs = load_documents(base.data)
    spec = init_spec(base, docs)
    key_path = None
    if private:
        key = Ed25519PrivateKey.generate()
        spec = spec.replace(membership=MembershipSpec(owner_key=public_key_text(key)))
        key_path = Path(owner_key) if owner_key else default_owner_key(spec.membership.owner_key)
        secret = (os.environ.get(PASSPHRASE_ENV) or click.prompt("passphrase for the owner key", hide_input=True,
                                                                  confirmation_prompt=True)) if passphrase else None
        save_owner_key(key, key_path, secret)
    if warm_start_steps:
        spec = _warm_start(spec, docs, warm_start_steps, warm_start_batch, seed, init_out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(spec.to_toml(), encoding="utf-8")
    click.echo(format_init_report(spec, docs))
    click.echo(f"wrote {out} (swarm id {spec.swarm_id})")
    if warm_start_steps:
        click.echo(f"round 0: {warm_start_steps} warm-start steps, weights in {init_out}: start your node with "
                   f"--init {init_out}; the others download them from peers and check their digests")
    if key_path:
        click.echo(f"private swarm: owner key {key_path} (mode 0600; back it up, never share it). Admit a node "
                   f"with: pathswarm swarm invite --swarm {out} --peer-id ID -o member.cert")


def _warm_start(spec: SwarmSpec, docs, steps: int, batch: int, seed: int, init_out: Path, force: bool) -> SwarmSpec:
    """Train round 0 (node/train/warm_start.py) with a progress line; write it as a checkpoint; the spec naming it."""
    import shutil
    import time

    from pathswarm.node.train.checkpoint import save_checkpoint
    from pathswarm.node.train.warm_start import module_states, warm_started

    t0, every = time.monotonic(), max(1, steps // 20)

    def progress(step: int, loss: float) -> None:
        if (step + 1) % every == 0 or step + 1 == steps:
            click.echo(f"\rwarm start: step {step + 1}/{steps}, loss {loss:.3f}, {time.monotonic() - t0:.0f} s",
                       nl=step + 1 == steps, err=True)

    spec, weights = warm_started(spec, docs, steps, batch, seed, on_step=progress)
    if force and init_out.exists():
        shutil.rmtree(init_out)
    save_checkpoint(init_out, spec, 0, module_states(spec, weights))
    return spec


@swarm.command("id")
@click.argument("spec_path", type=click.Path(dir_okay=False))
@friendly
def swarm_id(spec_path: str) -> None:
    """Print the swarm id (sha256 of the canonical spec) of SPEC_PATH."""
    click.echo(load_spec_option(spec_path).swarm_id)


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
    spec = load_spec_option(spec_path)
    if not spec.membership.private:
        raise ValueError(f"{spec_path} is an open swarm (no membership.owner_key): anyone may join it; "
                         "create a private one with `pathswarm swarm init --private`")
    key_path, key = _owner_of(spec, spec_path, owner_key)
    cert = issue(key, spec.swarm_id, peer_id.strip(), parse_expiry(expires))
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(cert.expires_at))
    if output:
        Path(output).write_text(cert.token + "\n", encoding="ascii")
        click.echo(f"wrote {output}: peer {cert.peer_id} may join swarm {spec.name!r} until {when}")
    else:
        click.echo(cert.token)
        click.echo(f"(peer {cert.peer_id} may join swarm {spec.name!r} until {when})", err=True)


def _owner_of(spec: SwarmSpec, spec_path: str, owner_key: str | None) -> tuple[Path, Ed25519PrivateKey]:
    """The private swarm's owner key (asking for its passphrase if it is encrypted), checked against the spec."""
    key_path = Path(owner_key) if owner_key else default_owner_key(spec.membership.owner_key)
    secret = None
    if owner_key_encrypted(key_path):
        secret = os.environ.get(PASSPHRASE_ENV) or click.prompt(f"passphrase of owner key {key_path}", hide_input=True)
    key = load_owner_key(key_path, secret)
    if public_key_text(key) != spec.membership.owner_key:
        raise ValueError(f"{key_path} is not the owner key of {spec_path} (its public key differs from the spec's)")
    return key_path, key


@swarm.command("revoke")
@click.option("--swarm", "spec_path", required=True, type=click.Path(dir_okay=False), help="The private swarm's spec.")
@click.option("--peer-id", "peer_ids", required=True, multiple=True,
              help="A peer id to revoke (repeat for several). Its certificate stops working everywhere.")
@click.option("--owner-key", type=click.Path(dir_okay=False), default=None,
              help="The owner key (default: the one `swarm init --private` wrote for this spec).")
@click.option("--list", "list_path", type=click.Path(dir_okay=False), default=None,
              help="The swarm's revocation list, updated in place (default: next to the owner key, .revoked).")
@click.option("--initial-peer", "initial_peers", multiple=True,
              help="Publish the list to the swarm now, through this peer (repeat for several). Nodes enforce it "
                   "from their next round and relay it; without it, only the list file is written.")
@friendly
def swarm_revoke(spec_path: str, peer_ids: tuple[str, ...], owner_key: str | None, list_path: str | None,
                 initial_peers: tuple[str, ...]) -> None:
    """Revoke members of a private swarm: sign the list of every revoked peer id and publish it.

    The list is cumulative (kept in --list); the newest one signed by the owner wins everywhere. A revoked
    peer's records, contributions and state requests are refused by every node that has read it."""
    spec = load_spec_option(spec_path)
    if not spec.membership.private:
        raise ValueError(f"{spec_path} is an open swarm (no membership.owner_key): there is nobody to revoke")
    key_path, key = _owner_of(spec, spec_path, owner_key)
    list_file = Path(list_path) if list_path else key_path.with_name(key_path.name + ".revoked")
    earlier = None
    if list_file.exists():
        earlier = verify_revocations(list_file.read_text(encoding="ascii"), owner_key=spec.membership.owner_key,
                                     swarm_id=spec.swarm_id)
    # Strictly newer than the list it extends, even within the same second: the newest list wins everywhere.
    now = max(time.time(), earlier.issued_at + 1) if earlier else time.time()
    revs = sign_revocations(key, spec.swarm_id, (earlier.peers if earlier else frozenset()) |
                            {p.strip() for p in peer_ids}, now=now)
    list_file.write_text(revs.token + "\n", encoding="ascii")
    click.echo(f"wrote {list_file}: {len(revs.peers)} peer(s) revoked from swarm {spec.name!r}")
    if initial_peers:
        from pathswarm.protocol.dht import publish_revocations
        from pathswarm.protocol.net import start_net
        from pathswarm.protocol.records import announce_ttl_s

        # A client (it serves nothing, so "accepted" means another peer took it), admitted by a short certificate
        # the owner signs for it: only members may relay the list.
        with start_net(list(initial_peers), spec=spec, client_mode=True) as net:
            net.membership = issue(key, spec.swarm_id, net.peer_id, time.time() + 600).token
            if not publish_revocations(net, spec, revs.token, announce_ttl_s(spec)):
                raise ValueError("no peer of the swarm accepted the revocation list; try again with another "
                                 "--initial-peer")
        click.echo("published: nodes refuse the revoked peers from their next round on")


# ---- the other commands, by concern --------------------------------------------------------------
for command in (swarm_status, swarm_dashboard):
    swarm.add_command(command)
for command in (node, bootstrap, simulate, demo, eval_cmd, generate, tune_command, model_group):
    main.add_command(command)


if __name__ == "__main__":  # pragma: no cover
    main()
