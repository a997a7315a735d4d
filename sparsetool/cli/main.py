"""The ``sparsetool`` command: registers one small module per command.

Command modules keep heavy imports (torch, numpy, matplotlib) inside their functions so that
``sparsetool flops ...`` and ``--help`` start fast.
"""

from __future__ import annotations

import signal

import typer

from sparsetool import __version__
from sparsetool.cli import densify, diff, flops, prune, report, simulate, train
from sparsetool.cli import eval as eval_cli

app = typer.Typer(
    name="sparsetool",
    help="Prune, mask, densify and report unstructured-sparse checkpoints; account FLOPs; "
    "train sparse GPTs; model sparse hardware.",
    no_args_is_help=True,
    add_completion=False,
    # Help text is plain: "N:M:" must not become an emoji, "[default: ...]" must stay visible.
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

app.command("prune")(prune.prune)
app.command("densify")(densify.densify)
app.command("report")(report.report)
app.command("flops")(flops.flops)
app.command("train")(train.train)
app.command("simulate")(simulate.simulate)
app.command("eval")(eval_cli.eval_command)
app.command("diff")(diff.diff)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"sparsetool {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    pass


def _interrupt(signum: int, frame: object) -> None:
    # SIGTERM (kill, timeouts, job schedulers) cleans up like Ctrl-C: no partial output is left.
    raise KeyboardInterrupt


def main() -> None:
    signal.signal(signal.SIGTERM, _interrupt)
    app()
