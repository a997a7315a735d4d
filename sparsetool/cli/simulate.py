"""`sparsetool simulate`: what unstructured sparsity buys on a zero-skipping dataflow machine
versus GPUs, from real masks (the model: sparsetool.hardware)."""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import typer
from rich.markup import escape

from sparsetool.cli._output import (
    console,
    emit_json,
    failing_cleanly,
    note_reclaimed,
    print_table,
    progress_bar,
    si,
    targeting_note,
)
from sparsetool.cli._params import (
    UsageProblem,
    alone,
    checked,
    choice_option,
    choices,
    conflicting,
    default_targets_option,
    exclude_option,
    include_option,
    json_option,
    output_option,
    plot_option,
    quiet_option,
    seed_option,
    sparsities_option,
    tokens_option,
    usage_error,
    usage_errors,
    value_of,
)
from sparsetool.errors import ShapeError
from sparsetool.flops.presets import PRESETS
from sparsetool.util import options

if TYPE_CHECKING:
    from sparsetool.hardware.result import SimulationResult

EXAMPLES = (  # the end of --help (two or three): each runs as written (given the files named)
    "sparsetool simulate --model gpt3-xl --sparsity 0.75",
    "sparsetool simulate --shape 12288x12288 --sweep --plot speedup.png",
    "sparsetool simulate --measured bench.json --fit -o cpu-fitted.toml",
)


if TYPE_CHECKING:  # str Enums to the type checker; typer reads the choices made below

    class Preset(str, enum.Enum):  # noqa: UP042 (choices() makes these, not StrEnums)
        """A :func:`~sparsetool.cli._params.choices` Enum as the type checker sees it."""

    Pattern = Preset
else:
    Preset = choices("Preset", PRESETS)
    Pattern = choices("Pattern", ("random", "rows", "cols", "2:4"))


OPTION: dict[str, Any] = {
    "checkpoint": typer.Argument(
        None,
        metavar="CHECKPOINT",
        show_default=False,
        help="A .safetensors file or Hugging Face directory: simulate its real masks.",
    ),
    "shape": typer.Option(
        None,
        "--shape",
        metavar="MxK",
        callback=checked(options.check_shape),
        help="One M x K layer (M outputs, K inputs), e.g. 12288x12288, with a seeded mask.",
    ),
    "model": choice_option(
        Preset,
        None,
        "--model",
        case_sensitive=False,
        help="A flops preset with random masks at --sparsity.",
    ),
    "sparsity": sparsities_option(
        "Fraction of zeros for --shape/--model; a comma list (0.5,0.75,0.9) runs a sweep."
    ),
    "sweep": typer.Option(
        False,
        "--sweep",
        help="Sweep the SPDF Appendix C sparsities 0, .5, .67, ... .9 (theoretical 1x..10x).",
    ),
    "tokens": tokens_option(
        "--tokens",
        "Tokens per step (batch x sequence length), e.g. 2048 or 4K.",
        default="2048",
        short="-t",
    ),
    "pattern": choice_option(
        Pattern,
        "random",
        "--pattern",
        help="Synthetic mask for --shape: random; rows or cols (all pruning in the leading "
        "rows/columns); 2:4.",
    ),
    "seed": seed_option("Seed of the synthetic masks."),
    "hardware": typer.Option(
        None,
        "--hardware",
        help="TOML/YAML/JSON file overriding any preset constant or adding devices.",
    ),
    "device": typer.Option(
        [],
        "--device",
        "-d",
        metavar="DEVICE",
        help="Only this device (repeatable); --list-hardware names them.",
    ),
    "seq_len": typer.Option(
        None,
        "--seq-len",
        min=1,
        help="Sequence length for the attention work (default: the model's).",
    ),
    "verify": typer.Option(
        False,
        "--verify",
        help="Run the zero-skipping AXPY schedule on a small block and check it "
        "equals the dense masked matmul.",
    ),
    "plot": plot_option("Write speedup vs sparsity (with the theoretical line) to this PNG."),
    "layers": typer.Option(
        False, "--layers", help="Show every layer (default: the 8 most imbalanced)."
    ),
    "list_hardware": typer.Option(
        False,
        "--list-hardware",
        help="List the devices, their constants and where each comes from.",
    ),
    "include": include_option(
        "With CHECKPOINT: also simulate tensors matching this glob (repeatable)."
    ),
    "exclude": exclude_option(
        "With CHECKPOINT: leave out tensors matching this glob (repeatable; wins over --include)."
    ),
    "default_targets": default_targets_option(),
    "measured": typer.Option(
        None,
        "--measured",
        metavar="BENCH.json",
        help="Set the model against the kernel times "
        "`sparsetool bench --json` measured: per layer and batch, measured vs modelled times and "
        "speedups.",
    ),
    "fit": typer.Option(
        False,
        "--fit",
        help="With --measured (on a CPU): fit the cpu device's rates to the times and "
        "show the model after the fit.",
    ),
    "kernel": typer.Option(
        None,
        "--kernel",
        metavar="NAME",
        help="With --measured: the sparse kernel to compare "
        "(default: the one fastest at the most points).",
    ),
    "output": output_option(
        "With --fit: write the fitted device to this TOML hardware file (for --hardware)."
    ),
    "quiet": quiet_option(),
    "as_json": json_option(),
}
"""Each option of the command, made once."""


def simulate(
    checkpoint: Path | None = OPTION["checkpoint"],
    shape: str | None = OPTION["shape"],
    model: Preset | None = OPTION["model"],
    sparsity: str | None = OPTION["sparsity"],
    sweep: bool = OPTION["sweep"],
    tokens: str = OPTION["tokens"],
    pattern: Pattern = OPTION["pattern"],
    seed: int = OPTION["seed"],
    hardware: Path | None = OPTION["hardware"],
    device: list[str] = OPTION["device"],
    seq_len: int | None = OPTION["seq_len"],
    verify: bool = OPTION["verify"],
    plot: Path | None = OPTION["plot"],
    layers: bool = OPTION["layers"],
    list_hardware: bool = OPTION["list_hardware"],
    include: list[str] = OPTION["include"],
    exclude: list[str] = OPTION["exclude"],
    default_targets: bool = OPTION["default_targets"],
    measured: Path | None = OPTION["measured"],
    fit: bool = OPTION["fit"],
    kernel: str | None = OPTION["kernel"],
    output: Path | None = OPTION["output"],
    quiet: bool = OPTION["quiet"],
    as_json: bool = OPTION["as_json"],
) -> None:
    """Masked-kernel hardware model: time, speedup and breakdown per device."""
    # typer reads these two as text; their callbacks hand on the parsed values
    sparsities = cast("list[float] | None", sparsity)
    step_tokens = cast(float, tokens)
    alone(
        "list_hardware",
        ("hardware", "device", "as_json", "quiet"),
        "--list-hardware lists the devices and simulates nothing",
        "drop --list-hardware to simulate",
    )
    if measured is not None or fit or kernel is not None or output is not None:
        _measured(measured, fit, kernel, output, hardware, device, as_json)
        return
    if not list_hardware:
        _check_request(
            checkpoint,
            shape=shape,
            model=value_of(model),
            sparsity=sparsities,
            sweep=sweep,
            pattern=value_of(pattern),
            plot=plot,
            include=include,
            exclude=exclude,
            default_targets=default_targets,
            seq_len=seq_len,
            layers=layers,
            as_json=as_json,
        )
    _check_devices(hardware, device)
    if list_hardware:
        from sparsetool.hardware.request import hardware_constants

        with failing_cleanly():
            _list(hardware_constants(hardware, device), as_json)
        return
    with failing_cleanly():
        from sparsetool.hardware.request import run_simulation
        from sparsetool.hardware.result import SimulationResult

        with progress_bar(enabled=not (as_json or quiet)) as progress, _shape_hint():
            result = SimulationResult.from_result(
                run_simulation(
                    checkpoint,
                    shape=shape,
                    model=value_of(model),
                    sparsity=sparsities,
                    sweep=sweep,
                    tokens=step_tokens,
                    pattern=value_of(pattern),
                    seed=seed,
                    hardware=hardware,
                    devices=device,
                    seq_len=seq_len,
                    verify=verify,
                    plot=plot,
                    include=tuple(include),
                    exclude=tuple(exclude),
                    default_targets=default_targets,
                    progress=progress,
                )
            )
        targeting_note((result.workload["targeting"] or {}).get("note"), quiet)
    note_reclaimed(result.reclaimed)
    if as_json:
        emit_json(result.to_json())
    else:
        _render(result, layers)
    if result.verified is False:
        raise typer.Exit(1)


def _check_devices(hardware: Path | None, device: list[str]) -> None:
    """A bad --hardware file: exit 1; a --device it does not name: exit 2."""
    with failing_cleanly():
        from sparsetool.hardware.presets import load_devices
        from sparsetool.hardware.request import check_devices

        known, _ = load_devices(hardware)
    with usage_errors():
        check_devices(known, device)


def _measured(
    measured: Path | None,
    fit: bool,
    kernel: str | None,
    output: Path | None,
    hardware: Path | None,
    device: list[str],
    as_json: bool,
) -> None:
    """``--measured BENCH.json`` (with --fit, --kernel, -o): the model against measured times."""
    bench = _measured_usage(measured, fit, kernel, output, device)
    _check_devices(hardware, device)
    with failing_cleanly():
        from sparsetool.checkpoint.output_files import ResultDict
        from sparsetool.hardware.measured import run_measured

        res = run_measured(
            bench,
            hardware=hardware,
            device=device[0] if device else None,
            kernel=kernel,
            fit_it=fit,
            output=output,
        )
    assert isinstance(res, ResultDict)  # run_measured's result carries what it reclaimed
    note_reclaimed(res.reclaimed)
    if as_json:
        emit_json(res)
    else:
        _render_measured(res)


def _check_request(
    checkpoint: Path | None,
    *,
    shape: str | None,
    model: str | None,
    sparsity: list[float] | None,
    sweep: bool,
    pattern: str,
    plot: Path | None,
    include: list[str],
    exclude: list[str],
    default_targets: bool,
    seq_len: int | None,
    layers: bool,
    as_json: bool,
) -> None:
    """How the options combine (exit 2), before any file is read."""
    with usage_errors():
        from sparsetool.hardware.request import check_request

        runs = check_request(
            checkpoint,
            shape=shape,
            model=model,
            sparsity=sparsity,
            sweep=sweep,
            pattern=pattern,
            plot=plot,
            include=tuple(include),
            exclude=tuple(exclude),
            default_targets=default_targets,
        )
    swept = (
        (
            "--sweep"
            if sweep
            else "--plot"
            if sparsity is None
            else "--sparsity " + ",".join(f"{x:g}" for x in sparsity)
        )
        if len(runs) > 1
        else None
    )
    _conflicts(shape, seq_len, layers, as_json, swept)


def _conflicts(
    shape: str | None, seq_len: int | None, layers: bool, as_json: bool, swept: str | None
) -> None:
    """The options the simulation asked for would silently ignore."""
    conflicting(
        shape is not None and seq_len is not None,
        f"--shape {shape}",
        f"--seq-len {seq_len}",
        "one --shape layer has no attention work for a sequence length to set; drop "
        "--seq-len, or simulate a model, e.g. --model gpt2-small --seq-len "
        f"{seq_len} --sparsity 0.5",
    )
    conflicting(
        layers and as_json,
        "--json",
        "--layers",
        '--json lists every layer ("layers"); drop --layers, or drop --json for the table',
    )
    conflicting(
        layers and shape is not None,
        f"--shape {shape}",
        "--layers",
        "one --shape layer has no table of layers; drop --layers",
    )
    if swept:
        conflicting(
            layers,
            swept,
            "--layers",
            "a sweep prints one speedup per sparsity, not each layer; drop --layers, or give "
            "one --sparsity",
        )


def _measured_usage(
    measured: Path | None,
    fit: bool,
    kernel: str | None,
    output: Path | None,
    device: list[str],
) -> Path:
    """How --measured, --fit, --kernel and -o combine with each other and the rest (exit 2);
    the BENCH.json."""
    if measured is None:
        given = "--fit" if fit else f"--kernel {kernel}" if kernel is not None else f"-o {output}"
        raise UsageProblem(
            f"{given} goes with --measured BENCH.json (kernel times to set the model "
            "against): add it, e.g. sparsetool simulate --measured bench.json --fit, or drop "
            f"{given}"
        )
    alone(
        "measured",
        ("fit", "kernel", "output", "hardware", "device", "as_json", "quiet"),
        "--measured compares the model with the layers and batches the file measured",
        "drop --measured to simulate",
    )
    if output is not None and not fit:
        usage_error(f"-o {output} writes the device --fit fits: add --fit, or drop -o")
    if output is not None and output.suffix.lower() != ".toml":
        usage_error(
            f"-o {output}: the fitted device is written as TOML: give a name ending in "
            f".toml, e.g. -o {output.with_suffix('.toml')}"
        )
    if len(device) > 1:
        conflicting(
            True,
            f"--device {device[0]}",
            f"--device {device[-1]}",
            "--measured compares one device with the measurement; give one --device",
        )
    return measured


@contextlib.contextmanager
def _shape_hint() -> Iterator[None]:
    """A checkpoint whose shapes cannot be inferred: the library says what is missing, this says
    what simulate offers instead."""
    try:
        yield
    except ShapeError as e:
        extra = "add a config.json with vocab_size beside it, or " if e.missing == "vocab" else ""
        raise ShapeError(
            f"{e}; {extra}simulate a preset or one layer instead, e.g. --model gpt2-small "
            "--sparsity 0.5 or --shape 4096x4096 --sparsity 0.5"
        ) from None


def _t(s: float | None) -> str:
    if s is None:
        return "-"
    for unit, f in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if s >= f or unit == "ns":
            return f"{s / f:.3g} {unit}"
    return f"{s:g} s"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _value(value: Any, unit: str | None) -> str:
    """A constant for people: ``1.100 GHz``, ``312.00 TFLOP/s``, ``2 B``, ``1.395x``,
    ``850,000``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if unit == "x":
        return f"{value:g}x"
    if unit is None:
        return f"{value:,}" if isinstance(value, int) else f"{value:g}"
    if value >= 1000 or (value < 1 and unit == "s"):  # no milli-bytes: 0.25 B stays 0.25 B
        return si(value, unit)
    return f"{value:g} {unit}"


def _list(out: dict[str, Any], as_json: bool) -> None:
    """Each device's constants with units, each publication cited once per device, long sources
    wrapped under their own column (not back to column 0)."""
    import textwrap

    from sparsetool.hardware.presets import cite_once

    if as_json:
        emit_json(out)
        return
    width = max(console.width, 60)
    for name, d in out.items():
        consts = d["constants"]
        details, cited = cite_once({k: c["source"] for k, c in consts.items()})
        values = {k: _value(c["value"], c["unit"]) for k, c in consts.items()}
        kw, vw = max(map(len, consts)), max(map(len, values.values()))
        console.print(
            f"[bold]{escape(name)}[/] ({escape(d['kind'])})", highlight=False, soft_wrap=True
        )
        for key in consts:
            head = f"  {key:<{kw}}  {values[key]:>{vw}}  "
            lines = textwrap.wrap(details[key], width=max(20, width - len(head))) or [""]
            for i, line in enumerate(lines):
                console.print(
                    escape((head if i == 0 else " " * len(head)) + line),
                    highlight=False,
                    soft_wrap=True,
                )
        for i, cite in enumerate(cited, 1):
            for line in textwrap.wrap(
                cite,
                width=width - 2,
                initial_indent=f"  [{i}] ",
                subsequent_indent=" " * (len(str(i)) + 5),
            ):
                console.print(escape(line), highlight=False, soft_wrap=True)
        console.print()


def _render(res: SimulationResult, show_all: bool) -> None:
    w = res.workload
    head = (
        f"[bold]{escape(w['label'])}[/]  {w['tokens']:g} token{'' if w['tokens'] == 1 else 's'} "
        "per step"
        + (f" (sequences of {w['seq_len']})" if w.get("seq_len") else "")
        + ("" if res.sweep else f", targeted sparsity {w['targeted_sparsity']:.4f}")
    )
    console.print(head, highlight=False, soft_wrap=True)
    if res.sweep:
        _render_sweep(res)
    else:
        _render_point(res, show_all)
    for note in w.get("notes", []):
        console.print(f"note: {escape(note)}", highlight=False, soft_wrap=True)
    if res.verify:
        _render_verify(res.verify)


def _render_sweep(res: SimulationResult) -> None:
    """One speedup per device and sparsity; the 2:4 point and the plot when there are."""
    shape = res.workload["source"] == "shape"
    key = "forward_speedup" if shape else "train_speedup"
    what = "one forward matmul" if shape else "a training step"
    rows = [
        [
            "theoretical",
            *[f"{r['theoretical']:.2f}" if r["theoretical"] else "-" for r in res.runs],
        ]
    ]
    for n in res.runs[0]["devices"]:
        rows.append(
            [
                n,
                *[
                    "n/a" if r["devices"][n][key] is None else f"{r['devices'][n][key]:.2f}"
                    for r in res.runs
                ],
            ]
        )
    print_table(
        ["device", *[f"{r['sparsity']:.2f}" for r in res.runs]],
        rows,
        title=f"speedup of {what} over each device's dense run, by sparsity",
    )
    if res.nm_point:
        for n, d in res.nm_point["devices"].items():
            console.print(
                f"{escape(n)} on a 2:4 mask of the same shape (sparsity 0.5): {_x(d[key])}",
                highlight=False,
                soft_wrap=True,
            )
    if res.plot:
        console.print(f"plot written to {escape(res.plot)}", highlight=False, soft_wrap=True)


def _render_point(res: SimulationResult, show_all: bool) -> None:
    """One sparsity: each device's times, where they go, its refusal or notes; the layers."""
    console.print(
        f"theoretical speedup (dense FLOPs / sparse FLOPs): {_x(res.workload['theoretical'])}",
        highlight=False,
        soft_wrap=True,
    )
    times, parts = [], []
    for d in res.devices:
        if not d["applicable"]:
            times.append([d["name"], "refused", "-", "-", "-"])
            continue
        f, s = d["forward"], d["train_step"]
        b = s["breakdown"]
        times.append(
            [d["name"], _t(f["time_s"]), _x(f["speedup"]), _t(s["time_s"]), _x(s["speedup"])]
        )
        parts.append(
            [d["name"], _t(b["compute"]), _t(b["memory"]), _t(b["fixed"]), _t(b["imbalance"])]
        )
    print_table(
        ("device", "forward", "speedup", "train step", "speedup"),
        times,
        title="time, and speedup over the same device's dense run",
    )
    print_table(
        ("device", "compute", "memory", "fixed", "imbalance"),
        parts,
        title="where the training step's time goes (compute and memory overlap)",
    )
    for d in res.devices:
        if not d["applicable"]:
            console.print(
                f"  {escape(d['name'])}: refused: {escape(d['reason'])}",
                highlight=False,
                soft_wrap=True,
            )
        if d.get("busiest_over_mean") is not None:
            console.print(
                f"  {escape(d['name'])}: busiest core group does "
                f"{d['busiest_over_mean']:.3f}x the mean "
                "work; perfectly balanced it would reach "
                f"{_x(d['forward']['speedup_if_balanced'])} forward",
                highlight=False,
                soft_wrap=True,
            )
        for note in d["notes"]:
            console.print(f"  {escape(d['name'])}: {escape(note)}", highlight=False, soft_wrap=True)
    if len(res.layers) > 1:
        _render_layers(res, show_all)


def _render_verify(v: dict[str, Any]) -> None:
    ok = "[green]equal[/]" if v["equal"] else "[red]NOT equal[/]"
    console.print(
        f"verify: {v['axpys']} AXPYs (one per non-zero) over a "
        f"{v['block'][0]}x{v['block'][1]} block, "
        f"{v['core_groups'][0]}x{v['core_groups'][1]} core groups, {v['tokens']} tokens: {ok} "
        f"to the dense masked matmul (max |error| {v['max_abs_error']:.2g}); per-group AXPY "
        f"counts {'match' if v['axpys_match_tiles'] else 'DO NOT match'} the model's",
        highlight=False,
        soft_wrap=True,
    )


def _render_layers(res: SimulationResult, show_all: bool) -> None:
    rows = res.layers
    if not show_all:
        rows = sorted(rows, key=lambda r: -(r["busiest_over_mean"] or 1.0))[:8]
    names = [d["name"] for d in res.devices if d["applicable"]][:2]
    print_table(
        ("layer", "shape", "sparsity", "max/mean", *names),  # busiest core group / mean
        [
            [
                r["name"],
                f"{r['shape'][0]}x{r['shape'][1]}",
                f"{r['sparsity']:.3f}",
                f"{r['busiest_over_mean'] or 1.0:.3f}",
                *[_x(r["speedup"][n]) for n in names],
            ]
            for r in rows
        ],
        title=("every layer" if show_all else "the 8 most imbalanced layers (--layers for all)")
        + ": busiest core group's work over the mean, forward speedup",
    )


def _render_measured(res: dict[str, Any]) -> None:
    m, e = res["measurement"], res["error"]
    console.print(
        f"[bold]{escape(m['file'])}[/]: {escape(str(m['device']['name']))} "
        f"({m['device']['type']}, {m['dtype']}), against {escape(res['device']['name'])} "
        f"({res['device']['kind']}), sparse kernel {escape(res['kernel'])}",
        highlight=False,
        soft_wrap=True,
    )
    fitted = res["fit"]
    _measured_table(res["rows"], "measured vs modelled" + (" (before the fit)" if fitted else ""))
    console.print(_errors_line("model vs measured", e), highlight=False, soft_wrap=True)
    if not fitted:
        return
    from sparsetool.hardware.presets import UNITS

    print_table(
        ("constant", "start", "fitted"),
        [
            [
                k,
                _value(fitted["start"][k], UNITS.get(k)),
                _value(v, UNITS.get(k))
                + (" (not constrained)" if k in fitted["unconstrained"] else ""),
            ]
            for k, v in fitted["constants"].items()
        ],
        title="fitted: least squares on ln(modelled / measured) of the dense and sparse times",
    )
    if fitted["unconstrained"]:
        console.print(
            f"  not constrained (never sets the pace at the measured points; the "
            f"smallest value that fits as well is shown): "
            f"{', '.join(fitted['unconstrained'])}",
            highlight=False,
            soft_wrap=True,
        )
    _measured_table(fitted["rows"], "measured vs modelled after the fit")
    b, a = fitted["error_before"], fitted["error_after"]
    console.print(
        f"after the fit: time {_f(a['time'])} (before {_f(b['time'])}), speedup "
        f"{_f(a['speedup'])} (before {_f(b['speedup'])})",
        highlight=False,
        soft_wrap=True,
    )
    for w in fitted["warnings"]:
        console.print(f"note: {escape(w)}", highlight=False, soft_wrap=True)
    if fitted["output"]:
        console.print(
            f"fitted device written to {escape(fitted['output'])} (use it with --hardware "
            f"{escape(fitted['output'])})",
            highlight=False,
            soft_wrap=True,
        )


def _f(v: float | None) -> str:
    """An error factor: x1.25 is typically 25% off, either way."""
    return "-" if v is None else f"x{v:.2f}"


def _errors_line(what: str, e: dict[str, Any]) -> str:
    return (
        f"{what}, typical factor off (exp of the RMS log ratio) over {e['points']} points: "
        f"dense {_f(e['dense'])}, sparse {_f(e['sparse'])}, both {_f(e['time'])}, "
        f"speedup {_f(e['speedup'])}"
    )


def _measured_table(rows: list[dict[str, Any]], title: str) -> None:
    def layer(r: dict[str, Any]) -> str:
        shape = f"{r['shape'][0]}x{r['shape'][1]}"
        return shape if r["layer"] == shape else f"{r['layer']} ({shape})"

    body = [
        [
            layer(r),
            f"{r['sparsity']:.3f}",
            str(r["batch"]),
            _t(r["measured"]["dense_s"]),
            _t(r["modelled"]["dense_s"]),
            _t(r["measured"]["sparse_s"]),
            _t(r["modelled"]["sparse_s"]),
            _x(r["measured"]["speedup"]),
            _x(r["modelled"]["speedup"]),
        ]
        for r in rows
    ]
    print_table(
        ("layer", "sparsity", "batch", "dense", "model", "sparse", "model", "speedup", "model"),
        body,
        title=title + ": forward times and speedups (measured, then modelled)",
    )
    for r in rows:
        if r["note"]:
            console.print(
                f"  {escape(layer(r))} batch {r['batch']}: {escape(r['note'])}",
                highlight=False,
                soft_wrap=True,
            )
