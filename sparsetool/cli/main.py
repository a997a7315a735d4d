"""The ``sparsetool`` command: registers one small module per command.

Command modules keep heavy imports (torch, numpy, matplotlib) inside their functions so that
``sparsetool flops ...`` and ``--help`` start fast.
"""

from __future__ import annotations

import signal
from typing import Callable

import typer

from sparsetool import __version__
from sparsetool.cli import densify, diff, flops, prune, report, simulate, train
from sparsetool.cli import eval as eval_cli
from sparsetool.cli._params import epilog

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

for _name, _module, _function in (
    ("prune", prune, prune.prune), ("densify", densify, densify.densify),
    ("report", report, report.report), ("flops", flops, flops.flops),
    ("train", train, train.train), ("simulate", simulate, simulate.simulate),
    ("eval", eval_cli, eval_cli.eval_command), ("diff", diff, diff.diff),
):
    app.command(_name, epilog=epilog(getattr(_module, "EXAMPLES", ())))(_function)


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


def _run_interruptibly(command: Callable[[], object]) -> None:
    """Run ``command`` with SIGTERM cleaning up like Ctrl-C.

    Once the command has ended (its output complete, or removed and reported), both signals are
    ignored: a KeyboardInterrupt raised during the interpreter's exit would only break the joining
    of worker threads (a hang or an abort) and replace the command's exit code.
    """
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        command()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def main() -> None:
    _run_interruptibly(app)
