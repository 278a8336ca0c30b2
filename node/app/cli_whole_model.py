"""`pathswarm model pull | assemble | export`: hold the whole model a swarm trained, and hand paths to other tools.

`pull` downloads every module from a running swarm (node/peer/pull.py), `assemble` takes them from node checkpoints
on disk (node/train/assemble.py); both write a whole-model directory (node/train/model_dir.py) that `eval` and
`generate` read without --spec. `export --hf` writes paths as Hugging Face models (node/app/hf_model.py).
"""

from __future__ import annotations

import time
from pathlib import Path

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from pathswarm.node.app.cli_common import friendly
from pathswarm.node.app.fmt import fmt_bytes

# torch, hivemind and transformers are imported inside the commands, after their options are checked.


@click.group("model")
def model_group() -> None:
    """The whole model: pull it from a swarm, assemble it from node checkpoints, export paths to Hugging Face."""


@model_group.command("pull")
@click.option("--swarm", "spec_path", default=None, help="The swarm's spec (TOML), or 'public'.")
@click.option("--join", "join_id", default=None, help="Or the swarm's id: its spec is fetched through --initial-peer.")
@click.option("--initial-peer", "initial_peers", multiple=True, help="A peer of the swarm (repeat for several).")
@click.option("--membership", "membership_file", type=click.Path(dir_okay=False), default=None,
              help="A private swarm's certificate for this puller's identity (holders serve weights to members).")
@click.option("--identity", type=click.Path(dir_okay=False), default=None,
              help="Identity key file (default with --membership: the node's, in the data directory).")
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Directory of the whole model (created; a pull interrupted there resumes).")
@click.option("--patience-s", type=click.FloatRange(0.0, 3600.0), default=None,
              help="How long to look again at a module no majority vouches for yet (default: the spec's averaging "
                   "timeout).")
@friendly
def pull(spec_path: str | None, join_id: str | None, initial_peers: tuple[str, ...], membership_file: str | None,
         identity: str | None, out_dir: str, patience_s: float | None) -> None:
    """Download every module's current state from a running swarm into one whole model.

    \b
    Each module is accepted as a joining node accepts it: the state a strict majority of its holders announce,
    downloaded from them (in parts from several at once), checked against its digest. Nothing in the swarm stops or
    waits. Then: pathswarm generate --checkpoint OUT --prompt "…", pathswarm eval --checkpoint OUT."""
    from pathswarm.node.peer.joining import resolve_identity, resolve_swarm

    spec, initial_peers = resolve_swarm(spec_path, join_id, initial_peers)
    if not initial_peers:
        raise click.UsageError("--initial-peer is required: the address of any peer of the swarm")
    ident, token = resolve_identity(identity, membership_file, spec)
    from pathswarm.node.model.model import count_module_params
    from pathswarm.node.peer.pull import pull_model

    console = Console(stderr=True, soft_wrap=True)  # one line per module, also in a log file
    t0 = time.monotonic()
    sizes = {mid: 8 * n for mid, n in count_module_params(spec).items()}  # anchor and momentum, fp32
    total, done = sum(sizes.values()), {"modules": 0}
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        what = f"swarm {spec.name} ({spec.swarm_id[:12]}…)"
        task = progress.add_task(f"{what}: 0/{len(sizes)} modules", total=total)

        def on_bytes(n: int) -> None:
            progress.advance(task, n)

        def on_module(p) -> None:
            done["modules"] += 1
            if not p.bytes:  # kept from an interrupted pull: nothing downloaded now
                progress.advance(task, sizes[p.module])
            progress.update(task, description=f"{what}: {done['modules']}/{len(sizes)} modules")
            where = (f"{p.vouchers} of {p.counted} holders vouch, from {p.source}, {fmt_bytes(p.bytes)} in "
                     f"{p.seconds:.1f} s") if p.bytes else p.source
            progress.console.print(f"{p.module}: round {p.round} ({p.digest[:12]}), {where}", highlight=False)

        round_dir, _ = pull_model(spec, initial_peers, out_dir, identity=ident, membership=token,
                                  patience_s=patience_s, on_module=on_module, on_bytes=on_bytes)
    console.print(f"whole model in {out_dir} ({round_dir.name}, {len(sizes)} modules, {fmt_bytes(total)}) in "
                  f"{time.monotonic() - t0:.1f} s")
    _next_steps(out_dir)


@model_group.command("assemble")
@click.argument("checkpoints", nargs=-1, required=True, type=click.Path())
@click.option("--spec", "spec_path", required=True, type=click.Path(dir_okay=False), help="Swarm spec (TOML).")
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Directory of the whole model (created).")
@friendly
def assemble(checkpoints: tuple[str, ...], spec_path: str, out_dir: str) -> None:
    """Build one whole model from node checkpoints on disk (CHECKPOINTS: their directories), module by module.

    \b
    Each module is taken at the newest round the checkpoints agree on (where nodes stopped on different versions of
    a round, the version most of them hold, else an older round they agree on); the table says where each came
    from."""
    from pathswarm.node.app.cli_common import load_spec_option
    from pathswarm.node.train.assemble import assemble as assemble_model
    from pathswarm.node.train.assemble import provenance
    from pathswarm.node.train.model_dir import write_model

    spec = load_spec_option(spec_path)
    modules, chosen, trained = assemble_model(spec, checkpoints)
    table = Table(title=f"whole model of swarm {spec.name} ({spec.swarm_id[:12]}…)")
    for col in ("module", "round", "digest", "held by", "read from"):
        table.add_column(col)
    for c in chosen:
        table.add_row(c.module, str(c.round), c.digest[:12], f"{len(c.held_by)} of {len(checkpoints)}",
                      str(c.source))
    console = Console()
    console.print(table)
    for c in chosen:
        for note in c.notes:
            console.print(f"{c.module}: {note}")
    round_dir = write_model(out_dir, spec, modules, provenance(chosen, trained))
    console.print(f"whole model in {out_dir} ({round_dir.name})")
    _next_steps(out_dir)


@model_group.command("export")
@click.argument("checkpoint", type=click.Path())
@click.option("--hf", "hf_dir", required=True, type=click.Path(file_okay=False),
              help="Write Hugging Face model directories here (transformers loads each with its stock classes).")
@click.option("--path", "path", default=None,
              help="Export this path only, into --hf itself (default: every path the checkpoint holds, each into "
                   "--hf/path-X.Y).")
@click.option("--spec", "spec_path", default=None, type=click.Path(dir_okay=False),
              help="Swarm spec (TOML); default: the spec stored with a whole model.")
@click.option("--eval-batches", type=click.IntRange(1, 1000), default=8, show_default=True,
              help="Validation batches per path for the model card's loss.")
@friendly
def export(checkpoint: str, hf_dir: str, path: str | None, spec_path: str | None, eval_batches: int) -> None:
    """Export paths of CHECKPOINT (a whole model or a node's checkpoint) as Hugging Face models.

    \b
    Each is a GPT-2 (`AutoModelForCausalLM`) with a byte-level tokenizer (`AutoTokenizer`), the spec, the router
    and a model card beside it. Needs the optional extra: pip install 'pathswarm[hf]'."""
    from pathswarm.node.app.hf_model import export_hf
    from pathswarm.node.train.checkpoint import load_checkpoint
    from pathswarm.node.train.model_dir import resolve_spec

    spec = resolve_spec(checkpoint, spec_path)
    ckpt = load_checkpoint(checkpoint, spec)
    _quiet_transformers()
    written = export_hf(spec, ckpt, hf_dir, path, eval_batches)
    for p, d, row in written:
        click.echo(f"path {p}: {d} (validation loss {row.loss:.4f} nats/byte)")
    if written:
        click.echo(f'load it: AutoModelForCausalLM.from_pretrained("{written[0][1]}"), '
                   f'AutoTokenizer.from_pretrained("{written[0][1]}")')


def _quiet_transformers() -> None:
    """No progress bars from transformers' own saving ("Writing model shards"): the command says what it wrote."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return  # export_hf says what to install
    hf_logging.disable_progress_bar()


def _next_steps(out_dir: str) -> None:
    out = Path(out_dir)
    click.echo(f'next: pathswarm generate --checkpoint {out} --prompt "…"  ·  pathswarm eval --checkpoint {out}  ·  '
               f"pathswarm model export {out} --hf {out.parent / (out.name + '-hf')}")
