"""The one parser and validator of the options every command shares (no torch, no typer).

Library callers get a :class:`~sparsetool.errors.ConfigError` (a SparsetoolError: exit 1 when it
reaches the CLI); the CLI runs the same functions as option callbacks and turns the error into a
usage error (exit 2) before anything heavy is imported.

The rules, the same in prune, flops, simulate and train:

- sparsity S, the fraction of zeros: ``0 <= S <= 1``. S = 1 is allowed everywhere (every targeted
  weight zero: a legitimate end point of a sweep, and what ``--fraction`` refuses to reach).
- fraction F of the *remaining* non-zeros to prune (one iterative step): ``0 <= F < 1``.
- N:M: keep N of every M consecutive weights, integers with ``0 < N <= M``.
- token counts: ``26B``, ``2.6e10``, ``300M``, ``1_000``, ``64,512`` (suffixes K, M, B or G, T;
  decimal, not binary); must come out a whole number.
- seeds: whole numbers ``0 <= seed < 2**63``.
- include/exclude: glob patterns over tensor names, each non-empty.

Messages name options as the command line spells them (``--sparsity``). The Python API runs its
functions inside :func:`named_as_given`, which rewords a :class:`ConfigError` in the caller's
terms: ``sparsity=1.5: must be a number from 0 to 1 ...``. A check here records the option, the
value and the problem apart (:func:`option_error`), so the rewording is exact; any other
message naming options is reworded by their names (:func:`in_python_terms`).
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from decimal import Decimal, InvalidOperation

from sparsetool.errors import ConfigError
from sparsetool.util.wording import did_you_mean, plural

__all__ = [
    "option_error",
    "python_name",
    "in_python_terms",
    "named_as_given",
    "METHODS",
    "SCOPES",
    "CALIBRATION_METHODS",
    "ALLOCATIONS",
    "REFINEMENTS",
    "check_count",
    "check_dampening",
    "check_owl_m",
    "check_owl_lambda",
    "check_threshold",
    "check_sparsity",
    "check_fraction",
    "check_seed",
    "parse_sparsity",
    "parse_sparsities",
    "parse_fraction",
    "parse_nm",
    "parse_tokens",
    "parse_stage",
    "parse_globs",
    "parse_size",
    "check_device",
    "DEVICE_CHOICES",
    "COMPUTE_DTYPES",
    "check_choice",
    "parse_shape",
    "check_shape",
    "MAX_SHAPE_ENTRIES",
]

DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"
COMPUTE_DTYPES = ("float32", "bfloat16")  # --dtype of eval and calibration pruning

# The words prune's --method and --scope accept (the CLI lists them in --help without importing
# torch).
METHODS = ("magnitude", "random", "wanda", "sparsegpt")
# The methods that run calibration text through the model, block by block (ops/prune/calibrated.py).
CALIBRATION_METHODS = ("wanda", "sparsegpt")
SCOPES = ("layer", "global")
ALLOCATIONS = ("uniform", "owl")  # how --sparsity is spread over the blocks (masks/owl.py)
REFINEMENTS = ("none", "dsnot")  # what refines a calibrated mask (masks/dsnot.py)

_SUFFIX = {"k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
MAX_SEED = 2**63


def option_error(message: str, option: str, value: object, problem: str) -> ConfigError:
    """A :class:`ConfigError` with the command line's ``message``, recording ``option`` (its
    flag), the ``value`` it was given and the ``problem`` in words that need neither (``must be a
    number from 0 to 1``), from which :func:`in_python_terms` words it for a Python caller."""
    error = ConfigError(message)
    vars(error).update(option=option, value=value, problem=problem)
    return error


_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")
# a flag and the value or metavar it is shown with: --sparsity 0.75, --calibration FILE|DIR
_FLAG_VALUE = re.compile(
    _FLAG.pattern + r"(?: ('[^']*'|[A-Z][A-Z_|\[\],.]*|[-+]?\d[\w.,:]*(?<![.,:])))?"
)


def _named(text: str) -> str:
    """Every option ``text`` mentions by its parameter name (``name=VALUE`` when a value or a
    metavar follows it)."""
    return _FLAG_VALUE.sub(
        lambda m: python_name(m.group(0).split(" ")[0]) + (f"={m.group(2)}" if m.group(2) else ""),
        text,
    )


def python_name(option: str) -> str:
    """The Python API's parameter for a command-line option.

    >>> python_name("--max-memory"), python_name("-o"), python_name("--sparsity")
    ('max_memory', 'output', 'sparsity')
    """
    if option in ("-o", "--output"):
        return "output"
    return option.lstrip("-").replace("-", "_")


def in_python_terms(error: ConfigError, given: Mapping[str, object]) -> str:
    """``error``'s message for a caller of the Python API, whose arguments were ``given``: the
    option at fault as ``name=value`` (the value the caller gave), every other option by its
    parameter name.

    >>> try:
    ...     check_sparsity(1.5)
    ... except ConfigError as e:
    ...     print(in_python_terms(e, {"sparsity": 1.5}))
    sparsity=1.5: must be a number from 0 to 1 (the fraction of weights set to zero)
    >>> print(in_python_terms(ConfigError("--seq 1: must be at least 2"), {"seq": 1}))
    seq=1: must be at least 2
    >>> e = ConfigError("--scope global ranks weights by magnitude: use --method magnitude")
    >>> print(in_python_terms(e, {"scope": "global"}))
    scope='global': ranks weights by magnitude: use method magnitude
    >>> e = ConfigError("--tasks and --seq do not go together: add --text FILE or drop --seq")
    >>> print(in_python_terms(e, {"tasks": "x", "seq": 8}))
    tasks and seq do not go together: add text=FILE or drop seq
    """
    message = str(error)
    option = getattr(error, "option", None)
    if option is not None and (_FLAG.fullmatch(option) or option == "-o"):
        name = python_name(option)
        value = given.get(name, getattr(error, "value", None))
        return f"{name}={value!r}: {_named(getattr(error, 'problem', ''))}"
    lead = _FLAG.match(message)
    if lead and python_name(lead.group(0)) in given:
        name = python_name(lead.group(0))
        value = given[name]
        rest = message[lead.end() :]
        for shown in dict.fromkeys((repr(value), str(value), f"'{value}'")):
            if rest.startswith(f" {shown}") and rest[len(shown) + 1 : len(shown) + 2] in (
                "",
                " ",
                ":",
                ";",
                ",",
            ):
                rest = rest[len(shown) + 1 :]
                break
        else:
            if rest.startswith((" and ", " or ", ",")):  # options together: named, no value
                return _named(message)
        rest = rest.lstrip(":").strip()
        rest = rest[3:] if rest.startswith("is ") else rest
        return f"{name}={value!r}: {_named(rest)}"
    return _named(message)


@contextlib.contextmanager
def named_as_given(given: Mapping[str, object]) -> Iterator[None]:
    """Inside, a :class:`ConfigError` (an option's problem) leaves worded for a Python caller
    whose arguments were ``given`` (:func:`in_python_terms`); the same error, its message
    changed."""
    try:
        yield
    except ConfigError as e:
        e.args = (in_python_terms(e, given),)
        raise


def _number(value: object) -> float | None:
    """``value`` as a float if it is a real number (not a bool, not NaN), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)


def check_sparsity(value: float | str, option: str = "--sparsity") -> float:
    """Return ``value`` if it is a sparsity (a fraction of zeros, 0 <= S <= 1), else raise.

    >>> check_sparsity(0.75), check_sparsity(1)
    (0.75, 1.0)
    >>> check_sparsity(1.5)
    Traceback (most recent call last):
    ...
    sparsetool.errors.ConfigError: --sparsity must be a number from 0 to 1 (the fraction of weights
    set to zero), got 1.5; for example --sparsity 0.75
    """
    x = None if isinstance(value, str) else _number(value)
    if x is None or not (0 <= x <= 1):
        hint = f" (write {x:g}% as {x / 100:g})" if x is not None and 2 <= x <= 100 else ""
        example = (
            f"; for example {option} 0.75" if option.startswith("--") and " " not in option else ""
        )
        problem = "must be a number from 0 to 1 (the fraction of weights set to zero)"
        raise option_error(
            f"{option} {problem}, got {value!r}{hint}{example}", option, value, problem + hint
        )
    return x


def check_fraction(value: float | str, option: str = "--fraction") -> float:
    """Return ``value`` if it is a pruning fraction (0 <= F < 1), else raise.

    F is the fraction of the *remaining* non-zeros to prune in one iterative step; F = 1 would
    prune everything and is refused (use a sparsity of 1 for that).

    >>> check_fraction(0.2)
    0.2
    >>> check_fraction(1.0)
    Traceback (most recent call last):
    ...
    sparsetool.errors.ConfigError: --fraction must be at least 0 and below 1 (the fraction of the
    remaining non-zeros to prune), got 1.0; for example --fraction 0.2
    """
    x = None if isinstance(value, str) else _number(value)
    if x is None or not (0 <= x < 1):
        example = (
            f"; for example {option} 0.2" if option.startswith("--") and " " not in option else ""
        )
        problem = (
            "must be at least 0 and below 1 (the fraction of the remaining non-zeros to prune)"
        )
        raise option_error(f"{option} {problem}, got {value!r}{example}", option, value, problem)
    return x


def parse_sparsity(text: str | float, option: str = "--sparsity") -> float:
    """One sparsity from text (or a number).

    >>> parse_sparsity("0.75"), parse_sparsity("1.0"), parse_sparsity(0)
    (0.75, 1.0, 0.0)
    """
    x = _number(text)
    return check_sparsity(text if x is None else x, option)


def parse_fraction(text: str | float, option: str = "--fraction") -> float:
    """One pruning fraction from text (or a number).

    >>> parse_fraction("0.2")
    0.2
    """
    x = _number(text)
    return check_fraction(text if x is None else x, option)


def parse_sparsities(text: str, option: str = "--sparsity") -> list[float]:
    """``"0,0.5,0.75"`` -> ``[0.0, 0.5, 0.75]``; each checked like :func:`parse_sparsity`.

    >>> parse_sparsities("0, 0.5,0.75"), parse_sparsities("1")
    ([0.0, 0.5, 0.75], [1.0])
    >>> parse_sparsities("0.5,,0.7")
    Traceback (most recent call last):
    ...
    sparsetool.errors.ConfigError: --sparsity '0.5,,0.7': '' is not a number; give fractions of
    zeros like 0.75 or 0,0.5,0.75
    """
    out = []
    for part in str(text).split(","):
        try:
            float(part)
        except ValueError:
            problem = (
                f"'{part.strip()}' is not a number; give fractions of zeros like 0.75 or 0,0.5,0.75"
            )
            raise option_error(f"{option} '{text}': {problem}", option, text, problem) from None
        out.append(parse_sparsity(part, option))
    return out


def parse_nm(text: str, option: str = "--nm") -> tuple[int, int]:
    """``"2:4"`` -> ``(2, 4)``: keep N of every M consecutive weights, ``0 < N <= M``.

    >>> parse_nm("2:4")
    (2, 4)
    >>> parse_nm("4:2")
    Traceback (most recent call last):
    ...
    sparsetool.errors.ConfigError: --nm 4:2: need 0 < N <= M (keep N of every M weights)
    """
    try:
        n, m = (int(x) for x in str(text).split(":"))
    except ValueError:
        problem = "expected N:M with integers, e.g. 2:4 (keep 2 of every 4 weights)"
        raise option_error(f"{option} {text!r}: {problem}", option, text, problem) from None
    if not (0 < n <= m):
        problem = "need 0 < N <= M (keep N of every M weights)"
        raise option_error(f"{option} {text}: {problem}", option, text, problem)
    return n, m


def parse_tokens(text: str | int | float, option: str = "--tokens", minimum: int = 1) -> int:
    """A token count: ``26B``, ``2.6e10``, ``300M``, ``1_000`` or ``64,512`` -> an int.

    Suffixes K, M, B (or G), T are powers of 1000. The arithmetic is decimal, so ``64.512M`` is
    exactly 64512000; a count that is not a whole number, or below ``minimum``, is refused.

    >>> parse_tokens("26B"), parse_tokens("2.6e10"), parse_tokens("300M"), parse_tokens("1_000")
    (26000000000, 26000000000, 300000000, 1000)
    >>> parse_tokens("64,512"), parse_tokens("64.512M"), parse_tokens(2048)
    (64512, 64512000, 2048)
    >>> parse_tokens("lots")
    Traceback (most recent call last):
    ...
    sparsetool.errors.ConfigError: --tokens 'lots' is not a number of tokens; write e.g. 26B,
    2.6e10, 300M or 1_000
    """
    if isinstance(text, bool):
        text = "bad"
    value = _scaled(str(text).strip().replace(",", "").replace("_", ""), _SUFFIX)
    if not value.is_finite():
        problem = "not a number of tokens; write e.g. 26B, 2.6e10, 300M or 1_000"
        raise option_error(f"{option} {str(text)!r} is {problem}", option, text, problem)
    if value != value.to_integral_value():
        problem = f"a token count is a whole number, got {value:f}"
        raise option_error(f"{option} {text}: {problem}", option, text, problem)
    if value < minimum:
        least = {0: "zero or more", 1: "a positive number of"}.get(minimum, f"at least {minimum}")
        raise option_error(
            f"{option} {text}: give {least} tokens", option, text, f"give {least} tokens"
        )
    return int(value)


def parse_batches(text: str, option: str = "--batch") -> list[int]:
    """``"1,8,64"`` -> ``[1, 8, 64]``: distinct token counts (K suffixes allowed), in the order
    given.

    >>> parse_batches("1, 8,2K")
    [1, 8, 2000]
    >>> parse_batches("1,0")
    Traceback (most recent call last):
    ...
    sparsetool.errors.ConfigError: --batch '1,0': each batch is a whole number of at least 1, e.g.
    1,8,64,512,2048
    """
    out = []
    for part in str(text).split(","):
        try:
            value = parse_tokens(part, option)
        except ConfigError:
            raise ConfigError(
                f"{option} '{text}': each batch is a whole number of at least 1, "
                "e.g. 1,8,64,512,2048"
            ) from None
        if value in out:
            raise ConfigError(f"{option} '{text}': batch {value} is given twice")
        out.append(value)
    return out


_BYTES = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def _scaled(t: str, suffixes: dict[str, int]) -> Decimal:
    """``t`` as a decimal number times its suffix's multiplier (NaN when it is not a number)."""
    mult = suffixes.get(t[-1:].lower(), 1) if t and not t[-1:].isdigit() else 1
    try:
        return Decimal(t[:-1] if mult != 1 else t) * mult
    except InvalidOperation:
        return Decimal("NaN")


def parse_size(text: str | int, option: str = "--max-memory") -> int:
    """A memory size in bytes: ``12G``, ``512M``, ``1.5T``, ``2GB``, ``8GiB`` or a plain byte count.

    K, M, G, T are powers of 1024 (as ``free -h`` and the kernel count memory).

    >>> (
    ...     parse_size("12G"),
    ...     parse_size("512M"),
    ...     parse_size("1.5g"),
    ...     parse_size("8GiB"),
    ...     parse_size(2**21),
    ... )
    (12884901888, 536870912, 1610612736, 8589934592, 2097152)
    >>> parse_size("lots")
    Traceback (most recent call last):
    ...
    sparsetool.errors.ConfigError: --max-memory 'lots' is not a memory size; write e.g. 12G, 512M or
    1.5T
    """
    t = str(text).strip().lower().replace("_", "")
    for unit in ("ib", "b"):
        if t.endswith(unit) and t[: -len(unit)][-1:] in _BYTES:
            t = t[: -len(unit)]
    value = _scaled(t, _BYTES)
    if isinstance(text, bool) or not value.is_finite():
        problem = "not a memory size; write e.g. 12G, 512M or 1.5T"
        raise option_error(f"{option} {str(text)!r} is {problem}", option, text, problem)
    if value < 2**20:
        problem = "give at least 1M (a model needs more than that)"
        raise option_error(f"{option} {text}: {problem}", option, text, problem)
    return int(value)


def check_device(value: str, option: str = "--device") -> str:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (torch's device names); whether CUDA is there is
    checked where torch is loaded.

    >>> check_device("cuda:1")
    'cuda:1'
    >>> check_device("gpu")
    Traceback (most recent call last):
    ...
    sparsetool.errors.ConfigError: --device 'gpu': use auto, cpu, cuda or cuda:N
    """
    if value in ("auto", "cpu", "cuda") or (value.startswith("cuda:") and value[5:].isdigit()):
        return value
    problem = f"use {DEVICE_CHOICES}"
    raise option_error(f"{option} {value!r}: {problem}", option, value, problem)


def check_seed(value: int, option: str = "--seed") -> int:
    """Return ``value`` if it is a seed (a whole number, 0 <= seed < 2**63), else raise.

    >>> check_seed(0)
    0
    >>> check_seed(-1)
    Traceback (most recent call last):
    ...
    sparsetool.errors.ConfigError: --seed must be a whole number from 0 to 2**63 - 1, got -1
    """
    if isinstance(value, bool) or not isinstance(value, int) or not (0 <= value < MAX_SEED):
        problem = "must be a whole number from 0 to 2**63 - 1"
        raise option_error(f"{option} {problem}, got {value!r}", option, value, problem)
    return value


def check_workers(value: int, option: str = "--workers") -> int:
    """Return ``value`` if it is a number of worker threads (a whole number, at least 1), else
    raise.

    >>> check_workers(2)
    2
    >>> check_workers(0)
    Traceback (most recent call last):
    ...
    sparsetool.errors.ConfigError: --workers must be a whole number of 1 or more, got 0
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        problem = "must be a whole number of 1 or more"
        raise option_error(f"{option} {problem}, got {value!r}", option, value, problem)
    return value


def parse_stage(
    text: str, option: str = "--stage", example: str | None = None
) -> tuple[float, float]:
    """``"0.9:0.8"`` -> (sparsity 0.9, fraction 0.8 of the run); the sparsity as ``--sparsity``,
    the fraction in (0, 1]. ``example`` replaces the ``--stage 0.9:0.8 --stage 0:0.2`` a bad
    form is answered with (a config file writes a list).

    >>> parse_stage("0.9:0.8"), parse_stage("1:1")
    ((0.9, 0.8), (1.0, 1.0))
    >>> parse_stage("0.9")
    Traceback (most recent call last):
    ...
    sparsetool.errors.ConfigError: --stage '0.9' is not SPARSITY:FRACTION, e.g. --stage 0.9:0.8
    --stage 0:0.2
    """
    parts = str(text).split(":")
    if len(parts) != 2 or _number(parts[0]) is None or _number(parts[1]) is None:
        raise ConfigError(
            f"{option} {text!r} is not SPARSITY:FRACTION, e.g. "
            f"{example or f'{option} 0.9:0.8 {option} 0:0.2'}"
        )
    s = parse_sparsity(parts[0], f"{option} {text!r}: sparsity")
    f = float(parts[1])
    if not 0.0 < f <= 1.0:
        raise ConfigError(
            f"{option} {text!r}: the fraction of the run must be in (0, 1], got {f:g}"
        )
    return s, f


def parse_globs(patterns: Iterable[str] | str | None, option: str = "--include") -> tuple[str, ...]:
    """Glob patterns over tensor names as a tuple; a lone string is one pattern.

    >>> parse_globs(["*.mlp.*", " lm_head.weight "])
    ('*.mlp.*', 'lm_head.weight')
    >>> parse_globs(None)
    ()
    """
    if patterns is None:
        return ()
    if isinstance(patterns, str):
        patterns = (patterns,)
    takes = "takes a glob or a list of globs"
    if not isinstance(patterns, (list, tuple)):
        raise option_error(f"{option} {takes}, got {patterns!r}", option, patterns, takes)
    out = []
    for p in patterns:
        if not isinstance(p, str):
            raise option_error(f"{option} {takes}, got {p!r}", option, patterns, takes)
        if not p.strip():
            raise option_error(
                f"{option} needs a glob over tensor names, e.g. {option} '*.mlp.*', got {p!r}",
                option,
                patterns,
                "needs a glob over tensor names, e.g. '*.mlp.*'",
            )
        out.append(p.strip())
    return tuple(out)


def check_count(value: int, option: str, minimum: int = 1) -> int:
    """A whole number of at least ``minimum`` (``--samples``, ``--seq``, ``--blocksize``).

    >>> check_count(128, "--samples")
    128
    >>> check_count(0, "--seq")
    Traceback (most recent call last):
    ...
    sparsetool.errors.ConfigError: --seq 0: must be a whole number of at least 1
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        problem = f"must be a whole number of at least {minimum}"
        raise option_error(f"{option} {value}: {problem}", option, value, problem)
    return value


def _number_in(value: object, option: str, ok: Callable[[float], bool], what: str) -> float:
    x = _number(value)
    if x is None or not ok(x):
        raise option_error(f"{option} {value}: must be {what}", option, value, f"must be {what}")
    return x


def check_dampening(value: float, option: str = "--dampening") -> float:
    """SparseGPT's dampening, a fraction of the Hessian's mean diagonal: ``0 < d <= 1``.

    >>> check_dampening("0.01")
    0.01
    """
    return _number_in(
        value,
        option,
        lambda x: 0 < x <= 1,
        "a number above 0 and at most 1 (a fraction of the mean diagonal of X^T X, e.g. 0.01)",
    )


def check_owl_m(value: float, option: str = "--owl-m") -> float:
    """OWL's outlier threshold M, a multiple of the block's mean score: above 0.

    >>> check_owl_m("5")
    5.0
    """
    return _number_in(
        value,
        option,
        lambda x: 0 < x < math.inf,
        "a number above 0 (a score above M times the block's mean is an outlier; the paper uses 5)",
    )


def check_owl_lambda(value: float, option: str = "--owl-lambda") -> float:
    """OWL's lambda: block sparsities spread over ``2 * lambda``, from 0 to 0.5.

    >>> check_owl_lambda("0.08")
    0.08
    """
    return _number_in(
        value,
        option,
        lambda x: 0 <= x <= 0.5,
        "a number from 0 to 0.5 (block "
        "sparsities spread over 2 x lambda around the target; the paper uses 0.08)",
    )


def check_threshold(value: float, option: str = "--dsnot-threshold") -> float:
    """A threshold of at least 0 (DSnoT stops refining a row once its error is this small).

    >>> check_threshold("0.1")
    0.1
    """
    return _number_in(value, option, lambda x: 0 <= x < math.inf, "a number of at least 0")


def check_choice(
    value: str, option: str, choices: Sequence[str], case_sensitive: bool = True
) -> str:
    """``value`` if it is one of ``choices`` (in the choice's own spelling), else an error listing
    them and naming the closest.

    >>> check_choice("GPT3-XL", "--model", ["gpt2-small", "gpt3-xl"], case_sensitive=False)
    'gpt3-xl'
    >>> check_choice("gpt3xl", "--model", ["gpt2-small", "gpt3-xl"])
    Traceback (most recent call last):
    ...
    sparsetool.errors.ConfigError: --model 'gpt3xl' is not one of: gpt2-small, gpt3-xl (did you mean
    gpt3-xl?)
    """
    for choice in choices:
        if value == choice or (not case_sensitive and value.casefold() == choice.casefold()):
            return choice
    problem = f"not one of: {', '.join(choices)}{did_you_mean(value, choices)}"
    raise option_error(f"{option} {value!r} is {problem}", option, value, problem)


MAX_SHAPE_ENTRIES = 2**32  # 4 GiB of mask bytes: beyond this the machine runs out of memory


def parse_shape(text: str, option: str = "--shape") -> tuple[int, int]:
    """``"12288x12288"`` -> ``(12288, 12288)`` (M output features x K input features).

    >>> parse_shape("4096x1024")
    (4096, 1024)
    """
    parts = text.lower().split("x")
    try:
        m, k = (int(p) for p in parts)
    except ValueError:
        raise ConfigError(f"{option} must look like MxK (e.g. 12288x12288), got '{text}'") from None
    if m < 1 or k < 1:
        raise ConfigError(f"{option} needs positive sizes, got '{text}'")
    if m * k > MAX_SHAPE_ENTRIES:
        raise ConfigError(
            f"{option} {text} has {plural(m * k, 'weight')}; a synthetic mask that large does not "
            f"fit in memory here (limit {MAX_SHAPE_ENTRIES:,}): use --model NAME for whole "
            f"models, e.g. --model gpt3-175b --sparsity 0.9"
        )
    return m, k


def check_shape(text: str, option: str = "--shape") -> str:
    """``text`` itself if :func:`parse_shape` reads it (the CLI's check while parsing)."""
    parse_shape(text, option)
    return text
