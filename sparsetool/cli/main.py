"""The ``sparsetool`` command: one small module per command, imported only when it runs.

``sparsetool prune ...`` imports ``sparsetool.cli.prune`` and nothing of the other commands, and
command modules keep heavy imports (torch, numpy, matplotlib) inside their functions, so usage
errors and ``--help`` answer fast. ``sparsetool --help`` loads every command to list it.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
from collections.abc import Callable, Iterator
from difflib import get_close_matches
from typing import Any

import typer
from typer.core import TyperGroup

from sparsetool import __version__
from sparsetool.cli._click import NoArgsIsHelpError, NoSuchOption, UsageError
from sparsetool.util.wording import either

# name -> (module under sparsetool.cli, function, the first line of its help): the order is the
# order of ``sparsetool --help``, which lists the commands from here without importing them
# (tests/cli/test_cli_help.py checks each line equals the command's own).
COMMANDS: dict[str, tuple[str, str, str]] = {
    "prune": (
        "prune",
        "prune",
        "Prune CHECKPOINT: zero the smallest (or random) weights of every targeted tensor.",
    ),
    "shrink": (
        "shrink",
        "shrink",
        "Remove experts, blocks or widths (FFN, heads, hidden) into a smaller dense model.",
    ),
    "densify": (
        "densify",
        "densify",
        "Write CHECKPOINT as plain dense tensors: pruned weights become 0.0.",
    ),
    "convert": (
        "convert",
        "convert",
        "Convert a GGUF file into a Hugging Face directory, or a directory into a GGUF file.",
    ),
    "report": (
        "report",
        "report",
        "Per-tensor sparsity of CHECKPOINT, with each tensor's role and whether prune targets it.",
    ),
    "flops": (
        "flops",
        "flops",
        "Training and inference FLOPs, dense vs sparse, by Chinchilla Appendix F.",
    ),
    "train": (
        "train",
        "train",
        "Train the built-in byte-level GPT or fine-tune a Hugging Face model, dense or sparse.",
    ),
    "simulate": (
        "simulate",
        "simulate",
        "Masked-kernel hardware model: time, speedup and breakdown per device.",
    ),
    "bench": (
        "bench",
        "bench",
        "Time dense against sparse matrix products on this machine, per shape and batch.",
    ),
    "eval": (
        "eval",
        "eval_command",
        "Perplexity of each checkpoint on the same held-out text, or its accuracy on --tasks.",
    ),
    "diff": (
        "diff",
        "diff",
        "Compare the targeted weights of checkpoints A and B (say before and after fine-tuning).",
    ),
    "demo": (
        "demo",
        "demo",
        "Run the whole toolkit end to end on built-in data and print one summary table.",
    ),
}


def load_command(name: str) -> Any:
    """The click command ``name``, built from its module on first use."""
    from sparsetool.cli._params import epilog

    module_name, function_name, _ = COMMANDS[name]
    module = importlib.import_module(f"sparsetool.cli.{module_name}")
    one = typer.Typer(rich_markup_mode=None, add_completion=False)
    one.command(name, epilog=epilog(getattr(module, "EXAMPLES", ())))(
        getattr(module, function_name)
    )
    return typer.main.get_command(one)


class LazyCommands(TyperGroup):
    """A command group whose commands are imported when they are asked for."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in COMMANDS:
            return None
        if cmd_name not in self.commands:
            self.commands[cmd_name] = load_command(cmd_name)
        return self.commands[cmd_name]

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        # From the table: ``sparsetool --help`` imports no command module. Each summary whole,
        # wrapped under its column if the terminal is narrow (never cut with "...").
        with formatter.section("Commands"):
            formatter.write_dl([(name, summary) for name, (_, _, summary) in COMMANDS.items()])

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        # The group's own suggestion only knows commands already loaded: suggest from all of them.
        try:
            return super().resolve_command(ctx, args)
        except UsageError as e:
            matches = get_close_matches(args[0], list(COMMANDS)) if args else []
            if "Did you mean" in e.message:
                e.message = e.message[: e.message.index("Did you mean")].rstrip(" .")
            if matches:
                e.message = e.message.rstrip(".") + f" (did you mean {either(matches)}?)"
            raise

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        with _one_line_usage_errors():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: Any) -> Any:
        with _one_line_usage_errors():
            return super().invoke(ctx)


@contextlib.contextmanager
def _one_line_usage_errors() -> Iterator[None]:
    """A usage error (exit 2) prints one ``error:`` line on stderr, like every other error, not
    click's usage block: ours already name the option and the way out; click's own (an unknown
    option, a missing argument) add where the usage is."""
    try:
        yield
    except UsageError as e:
        if isinstance(e, NoArgsIsHelpError):
            raise
        from sparsetool.cli._params import UsageProblem

        text = e.format_message().strip()
        if isinstance(e, NoSuchOption):  # click's "Did you mean"/"Possible options" as ours
            text = f"no such option: {e.option_name}" + (
                f" (did you mean {either(e.possibilities)}?)" if e.possibilities else ""
            )
        if not isinstance(e, UsageProblem):  # "No such option: --x" -> "no such option: --x; ..."
            text = (text[:1].lower() if text[1:2].islower() else text[:1]) + text[1:].rstrip(".")
            text = " ".join(text.split())
            if e.ctx is not None:
                text += f" (see '{e.ctx.command_path} -h')"

        def show(file: Any = None) -> None:
            typer.echo(f"error: {text}", err=True)

        e.show = show  # type: ignore[method-assign]
        raise


app = typer.Typer(
    cls=LazyCommands,
    name="sparsetool",
    help="Prune checkpoints (magnitude, N:M, Wanda, SparseGPT) and shrink them (experts, blocks, "
    "widths); convert GGUF in and out; measure perplexity and task accuracy; account FLOPs; train "
    "sparse; model and measure sparse hardware.",
    no_args_is_help=True,
    add_completion=False,
    # Help text is plain: "N:M:" must not become an emoji, "[default: ...]" must stay visible.
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


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
    # numpy's OpenBLAS starts a thread per core when numpy is imported, which spins for a while and
    # makes every memory unmapping interrupt the other core. sparsetool never calls numpy's BLAS
    # (torch has its own), so the command runs it on one thread unless told otherwise:
    # `simulate --shape` measured 0.45 -> 0.39 s wall, 0.55 -> 0.37 s CPU (benchmarks/RESULTS.md).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from sparsetool.util.threads import before_torch

    # torch's idle OpenMP workers sleep rather than spin (see sparsetool/util/threads.py)
    before_torch()
    _run_interruptibly(app)
