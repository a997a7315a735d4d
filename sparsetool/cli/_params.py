"""The options every command shares, declared once: the same names, help and checks everywhere.

Each check is a function of :mod:`sparsetool.util.options` run as a click callback while the command
line is parsed, so a bad value is a usage error (exit 2) before torch is imported. Choice options
are str Enums, so ``--help`` lists their values, checked by :func:`choice_option`. Options that
contradict each other are refused by :func:`conflicting`, never silently ignored.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import typer

from sparsetool.checkpoint import ENCODINGS
from sparsetool.errors import SparsetoolError
from sparsetool.util import options
from sparsetool.util.faces import OptionsRecord

ENCODING_NAMES = ENCODINGS  # the choices of --encoding: the checkpoint package's public names

# Names the library defines in torch-importing modules, repeated here so --help lists them without
# loading torch; tests/cli/test_cli_vocabulary.py checks they equal the library's own.
TRAIN_PRESETS = ("tiny", "mini", "small", "base")  # sparsetool.models.gpt.PRESETS


if TYPE_CHECKING:

    class Choice(str, enum.Enum):  # noqa: UP042 (choices() makes these, not StrEnums)
        """A :func:`choices` Enum as the type checker sees it: a str Enum (its members are strs).
        A command names it for each of its choice options, ``from sparsetool.cli._params import
        Choice as Method`` under ``TYPE_CHECKING``, where typer reads the ``choices`` Enum."""


def choices(name: str, values: Iterable[str]) -> Any:
    """A str Enum whose values are ``values``: typer shows them as ``[a|b|c]`` and checks them."""
    return enum.Enum(name, {v: v for v in values}, type=str)


def choice_option(
    kind: Any, default: Any, *names: str, help: str, case_sensitive: bool = True
) -> Any:
    """An option taking one of the values of ``kind`` (a :func:`choices` Enum).

    A value not among them is a usage error naming the option, every choice and the closest:
    ``--model 'gpt3xl' is not one of: gpt2-small, gpt3-xl, ... (did you mean gpt3-xl?)``.
    """
    values = [member.value for member in kind]
    option = max(names, key=len)

    def parse(value: Any) -> Any:
        if isinstance(value, kind):
            return value
        try:
            return kind(options.check_choice(str(value), option, values, case_sensitive))
        except SparsetoolError as e:
            raise UsageProblem(str(e)) from None

    return typer.Option(default, *names, help=help, parser=parse, case_sensitive=case_sensitive)


def value_of(x: Any) -> Any:
    """An Enum choice's string (None and plain values pass through)."""
    return x.value if isinstance(x, enum.Enum) else x


def epilog(examples: Iterable[str]) -> str:
    """The end of a command's --help: its examples, one per line, never rewrapped."""
    return "Examples:\n\n\b\n" + "\n".join(examples)


class UsageProblem(typer.BadParameter):
    """A usage error (exit code 2) whose message already names the option at fault."""

    def format_message(self) -> str:
        return self.message


def usage_error(message: str) -> None:
    """Stop with a usage error: the message on stderr, exit code 2 (for checks that combine
    options)."""
    raise UsageProblem(message)


@contextlib.contextmanager
def usage_errors() -> Iterator[None]:
    """A SparsetoolError raised inside (a library check of how options combine) is a usage error."""
    try:
        yield
    except SparsetoolError as e:
        raise UsageProblem(str(e)) from None


def checked(check: Callable[..., Any], **kw: Any) -> Callable[..., Any]:
    """A click callback running ``check(value, option_name, **kw)``; its error becomes exit 2."""

    def callback(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
        if (
            ctx.resilient_parsing
            or value is None
            or (isinstance(value, (list, tuple)) and not value)
        ):
            return value
        name = max(param.opts, key=len)
        try:
            if isinstance(value, (list, tuple)) and check is not options.parse_globs:
                return [check(v, name, **kw) for v in value]
            return check(value, name, **kw)
        except SparsetoolError as e:
            # typer passes its _TyperParameter (what BadParameter takes), typed CallbackParam
            raise UsageProblem(str(e), ctx=ctx, param=param) from None  # type: ignore[arg-type]

    return callback


def given(param: str) -> bool:
    """Whether the command line set the running command's parameter ``param`` (its Python name),
    as opposed to its default."""
    from sparsetool.cli._click import ParameterSource, get_current_context

    source = get_current_context().get_parameter_source(param)
    return source is not None and source not in (
        ParameterSource.DEFAULT,
        ParameterSource.DEFAULT_MAP,
    )


def conflicting(when: Any, first: str, second: str, why: str) -> None:
    """Refuse ``first`` and ``second`` given together (``when``), as one of them would be silently
    ignored or undone: a usage error ``FIRST and SECOND do not go together: WHY``, where ``why``
    says what each does and what to drop."""
    if when:
        usage_error(f"{first} and {second} do not go together: {why}")


def alone(flag: str, allowed: Iterable[str], does: str, instead: str) -> None:
    """With the parameter ``flag`` given (a listing such as ``--list``), refuse every other option
    given but ``allowed`` (Python parameter names), which the listing would ignore: ``FLAG and X do
    not go together: DOES; drop X, or INSTEAD``."""
    from sparsetool.cli._click import get_current_context

    if not given(flag):
        return
    params = {p.name: p for p in get_current_context().command.params}
    for name, param in params.items():
        if name != flag and name not in allowed and given(name):
            shown = (
                max(param.opts, key=len)
                if param.param_type_name == "option"
                else param.metavar or param.name.upper()
            )
            conflicting(
                True, max(params[flag].opts, key=len), shown, f"{does}; drop {shown}, or {instead}"
            )


def in_place_conflict(checkpoint: Any, output: Any, in_place: bool) -> None:
    """``--in-place`` replaces CHECKPOINT itself: with ``-o`` naming another path, one of the two
    would be ignored (prune and densify)."""
    from pathlib import Path

    conflicting(
        in_place and output is not None and Path(output).resolve() != Path(checkpoint).resolve(),
        f"-o {output}",
        "--in-place",
        f"--in-place replaces {checkpoint} itself; drop -o {output}, or drop --in-place "
        f"to write {output} and leave {checkpoint} as it is",
    )


# --- output and verbosity ----------------------------------------------------------------------


def face_option(record: type[OptionsRecord], name: str) -> Any:
    """A typer option made from the field ``name`` of an options record
    (:mod:`sparsetool.util.faces`): its default, flag, metavar, help and the check run while
    parsing (a bad value: a usage error before torch loads). An option every command shares
    (``--seed``, ``--device``, ``--dtype``, ``--max-memory``, ``--plot``) is the shared one below,
    with the record's help and default."""
    value, shown = record.face(name)
    if shown.flag in SHARED:
        return SHARED[shown.flag](shown.help, value)
    parse = None if shown.parse is None else checked(shown.parse, **shown.limits)
    if isinstance(value, float):  # taken as text, which its check reads: --help shows 5, not 5.0
        value = f"{value:g}"
    return typer.Option(value, shown.flag, metavar=shown.metavar, callback=parse, help=shown.help)


def face_choice(record: type[OptionsRecord], kind: Any, name: str) -> Any:
    """A choice option (``kind``, a :func:`choices` Enum) from the field ``name`` of a record."""
    value, shown = record.face(name)
    return choice_option(kind, value, shown.flag, help=shown.help)


def output_option(help: str = "Where to write (same layout as the input).") -> Any:
    return typer.Option(None, "-o", "--output", help=help)


def json_option(help: str = "Print the result as JSON on stdout (no progress).") -> Any:
    return typer.Option(False, "--json", help=help)


def quiet_option() -> Any:
    return typer.Option(
        False,
        "-q",
        "--quiet",
        help="No progress bars or notes on stderr (the result is still printed).",
    )


def workers_option() -> Any:
    return typer.Option(
        None,
        "--workers",
        metavar="N",
        callback=checked(options.check_workers),
        help="Threads to work on (default: the usable cores). The output is the "
        "same byte for byte whatever N.",
    )


def _check_plot(value: Any, option: str) -> Any:
    from pathlib import Path

    if Path(value).suffix.lower() != ".png":
        from sparsetool.errors import ConfigError

        raise ConfigError(
            f"{option} {value}: plots are written as PNG: give a file name ending in .png, "
            f"e.g. {option} {Path(value).with_suffix('.png')}"
        )
    return value


def plot_option(help: str) -> Any:
    """``--plot FILE.png``: a file name not ending in .png is a usage error."""
    return typer.Option(
        None, "--plot", metavar="FILE.png", help=help, callback=checked(_check_plot)
    )


def use_workers(n: int | None) -> None:
    """Run the command's work on ``n`` threads (None: the default, see sparsetool.util.workers)."""
    from sparsetool.util import workers

    workers.set_workers(n)


def threads_option(when: str = "") -> Any:
    """``--threads N``; ``when`` says when it applies, for a command that uses torch only
    sometimes."""
    return typer.Option(
        None,
        "--threads",
        metavar="N",
        callback=checked(options.check_workers),
        help=f"CPU threads for torch{when} (default: the usable cores that other "
        "processes leave free, at least 1).",
    )


def use_threads(n: int | None) -> int:
    """Compute with torch on ``n`` threads (None: the default, see sparsetool.util.threads); imports
    torch. Returns the number in force."""
    from sparsetool.util import threads

    return threads.use_threads(n)


# --- the shared values -------------------------------------------------------------------------


def sparsity_option(help: str) -> Any:
    """One sparsity in [0, 1] (1.0 allowed: every targeted weight zero)."""
    return typer.Option(
        None, "--sparsity", "-s", help=help, metavar="S", callback=checked(options.parse_sparsity)
    )


def sparsities_option(help: str) -> Any:
    """A comma list of sparsities, each in [0, 1]."""
    return typer.Option(
        None,
        "--sparsity",
        "-s",
        help=help,
        metavar="S[,S...]",
        callback=checked(options.parse_sparsities),
    )


def tokens_option(
    name: str, help: str, *, default: Any = None, minimum: int = 1, short: str | None = None
) -> Any:
    """A token count such as 26B, 2.6e10, 300M or 1_000."""
    names = (name,) if short is None else (name, short)
    return typer.Option(
        default,
        *names,
        help=help,
        metavar="COUNT",
        callback=checked(options.parse_tokens, minimum=minimum),
    )


def seed_option(help: str = "Seed (a whole number from 0 to 2**63 - 1).", default: Any = 0) -> Any:
    return typer.Option(default, "--seed", help=help, callback=checked(options.check_seed))


def stage_option(help: str) -> Any:
    return typer.Option(
        [], "--stage", help=help, metavar="SPARSITY:FRACTION", callback=checked(options.parse_stage)
    )


def include_option(
    help: str = "Also target tensors whose name matches this glob (repeatable).",
) -> Any:
    return typer.Option(
        [], "--include", help=help, metavar="GLOB", callback=checked(options.parse_globs)
    )


def exclude_option(
    help: str = "Never target tensors whose name matches this glob (repeatable; "
    "wins over --include).",
) -> Any:
    return typer.Option(
        [], "--exclude", help=help, metavar="GLOB", callback=checked(options.parse_globs)
    )


def default_targets_option() -> Any:
    return typer.Option(
        False,
        "--default-targets",
        help="Target by the built-in roles even if the checkpoint records the "
        "--include/--exclude it was pruned with (globs given here win anyway).",
    )


# --- how a model runs (eval, calibration pruning; train has its own --dtype with auto) ------------

ComputeDType = choices("ComputeDType", options.COMPUTE_DTYPES)


def device_option(
    help: str = "Where the model runs: auto (a GPU if there is one), cpu, cuda or cuda:N.",
) -> Any:
    return typer.Option(
        "auto",
        "--device",
        metavar="<auto|cpu|cuda|cuda:N>",
        callback=checked(options.check_device),
        help=help,
    )


def compute_dtype_option(
    help: str = "Precision of the forward passes (bfloat16 halves the "
    "memory of weights and activations).",
) -> Any:
    return choice_option(ComputeDType, "float32", "--dtype", help=help)


def max_memory_option() -> Any:
    return typer.Option(
        None,
        "--max-memory",
        metavar="SIZE",
        callback=checked(options.parse_size),
        help="Memory the run may use, e.g. 12G (default: what is available now); "
        "a run that cannot fit stops before the long part.",
    )


def use_device(device: str) -> None:
    """Refuse a device this machine lacks (--device cuda without CUDA) as a usage error, before
    any checkpoint is read. Imports torch only when a GPU is asked for by name."""
    if device.startswith("cuda"):
        with usage_errors():
            from sparsetool.models.open import resolve_device

            resolve_device(device)


def checkpoint_argument(required: bool = True) -> Any:
    return typer.Argument(
        ... if required else None,
        metavar="CHECKPOINT",
        help="A .safetensors file or a Hugging Face model directory.",
        show_default=False,
    )


__all__ = [
    "ENCODING_NAMES",
    "TRAIN_PRESETS",
    "UsageProblem",
    "choices",
    "choice_option",
    "given",
    "conflicting",
    "alone",
    "in_place_conflict",
    "plot_option",
    "epilog",
    "value_of",
    "usage_error",
    "usage_errors",
    "checked",
    "output_option",
    "json_option",
    "quiet_option",
    "workers_option",
    "use_workers",
    "threads_option",
    "use_threads",
    "sparsity_option",
    "sparsities_option",
    "tokens_option",
    "seed_option",
    "stage_option",
    "include_option",
    "exclude_option",
    "default_targets_option",
    "checkpoint_argument",
    "ComputeDType",
    "device_option",
    "compute_dtype_option",
    "max_memory_option",
    "use_device",
]


# The shared options an options record's field stands for (face_option): the field's help and
# default, the shared option's flag, metavar and check.
SHARED: dict[str, Callable[[str, Any], Any]] = {
    "--seed": lambda help, default: seed_option(help, default=default),
    "--device": lambda help, default: device_option(help),
    "--dtype": lambda help, default: compute_dtype_option(help),
    "--max-memory": lambda help, default: max_memory_option(),
    "--plot": lambda help, default: plot_option(help),
}
