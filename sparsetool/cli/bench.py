"""``sparsetool bench``: dense against sparse matrix products, measured on this machine, for a
checkpoint's real masks, a preset's shapes or one shape (the library: sparsetool.bench)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import typer
from rich.markup import escape

from sparsetool.bench.kernels import SPARSE as KERNELS
from sparsetool.cli._output import (
    console,
    emit_json,
    fail,
    failing_cleanly,
    note_reclaimed,
    print_table,
    progress_bar,
    targeting_note,
)
from sparsetool.cli._params import (
    ComputeDType,
    checked,
    checkpoint_argument,
    choice_option,
    choices,
    compute_dtype_option,
    conflicting,
    default_targets_option,
    device_option,
    exclude_option,
    include_option,
    json_option,
    plot_option,
    quiet_option,
    seed_option,
    sparsities_option,
    threads_option,
    usage_error,
    usage_errors,
    use_device,
    use_threads,
    value_of,
)
from sparsetool.flops.presets import PRESETS
from sparsetool.util import options
from sparsetool.util.wording import plural

KERNEL_NAMES = ", ".join(KERNELS)

EXAMPLES = (  # the end of --help: each runs as written (given the files named)
    "sparsetool bench pruned.safetensors --batch 1,64,2048",
    "sparsetool bench --model gpt2-small --sparsity 0.9 --batch 1,8",
    "sparsetool bench --shape 4096x4096 --sparsity 0.5,0.7,0.9,0.95 --batch 1,64 --plot bench.png",
)

if TYPE_CHECKING:  # str Enums to the type checker; typer reads the choices made below
    from sparsetool.cli._params import Choice as Pattern
    from sparsetool.cli._params import Choice as Preset
else:
    Preset = choices("Preset", PRESETS)
    Pattern = choices("Pattern", ("random", "rows", "cols", "2:4"))


OPTION: dict[str, Any] = {
    "checkpoint": checkpoint_argument(required=False),
    "model": choice_option(
        Preset,
        None,
        "--model",
        case_sensitive=False,
        help="A flops preset: its matrix shapes with random weights and masks at --sparsity.",
    ),
    "shape": typer.Option(
        None,
        "--shape",
        metavar="MxK",
        callback=checked(options.check_shape),
        help="One M x K layer (M outputs, K inputs), e.g. 4096x4096, with a seeded mask.",
    ),
    "sparsity": sparsities_option(
        "Fraction of zeros for --model/--shape; a comma list (0.5,0.7,0.9) also finds the "
        "break-even sparsity."
    ),
    "pattern": choice_option(
        Pattern,
        "random",
        "--pattern",
        help="The mask of --shape: random; rows or cols (all pruning in the leading "
        "rows/columns); 2:4.",
    ),
    "batch": typer.Option(
        "1,8,64,512,2048",
        "--batch",
        "-b",
        metavar="B[,B...]",
        callback=checked(options.parse_batches),
        help="Tokens per product (rows of the input): 1 is decoding one token, 2048 a long prompt.",
    ),
    "kernel": typer.Option(
        [],
        "--kernel",
        "-k",
        metavar="NAME",
        help=f"Only this sparse kernel (repeatable): {KERNEL_NAMES}.",
    ),
    "device": device_option("Where to time: auto (a GPU if there is one), cpu, cuda or cuda:N."),
    "dtype": compute_dtype_option(
        "Precision of the weights and inputs (the CPU's sparse kernels hold bfloat16 values in "
        "float32)."
    ),
    "repeats": typer.Option(
        5,
        "--repeats",
        "-r",
        metavar="N",
        callback=checked(options.check_count),
        help="Timed calls per product at least (more while they take "
        "under 0.2 s in all); the median is reported with its spread.",
    ),
    "seed": seed_option("Seed of the inputs and of the synthetic weights and masks."),
    "threads": threads_option(),
    "include": include_option(
        "With CHECKPOINT: also time tensors matching this glob (repeatable)."
    ),
    "exclude": exclude_option(
        "With CHECKPOINT: leave out tensors matching this glob (repeatable; wins over --include)."
    ),
    "default_targets": default_targets_option(),
    "plot": plot_option("Write speed-up against batch (or sparsity) to this PNG."),
    "quiet": quiet_option(),
    "as_json": json_option(),
}
"""Each option of the command, made once."""


def bench(
    checkpoint: Path | None = OPTION["checkpoint"],
    model: Preset | None = OPTION["model"],
    shape: str | None = OPTION["shape"],
    sparsity: str | None = OPTION["sparsity"],
    pattern: Pattern = OPTION["pattern"],
    batch: str = OPTION["batch"],
    kernel: list[str] = OPTION["kernel"],
    device: str = OPTION["device"],
    dtype: ComputeDType = OPTION["dtype"],
    repeats: int = OPTION["repeats"],
    seed: int = OPTION["seed"],
    threads: int | None = OPTION["threads"],
    include: list[str] = OPTION["include"],
    exclude: list[str] = OPTION["exclude"],
    default_targets: bool = OPTION["default_targets"],
    plot: Path | None = OPTION["plot"],
    quiet: bool = OPTION["quiet"],
    as_json: bool = OPTION["as_json"],
) -> None:
    """Time dense against sparse matrix products on this machine, per shape and batch."""
    batches = value_of(batch)
    levels = cast("list[float] | None", sparsity)  # --sparsity's callback parsed the text
    with usage_errors():
        _check_usage(
            checkpoint=checkpoint,
            model=value_of(model),
            shape=shape,
            sparsity=levels,
            pattern=value_of(pattern),
            include=include,
            exclude=exclude,
            default_targets=default_targets,
            kernel=kernel,
        )
    use_device(device)
    n_threads = use_threads(threads)
    with failing_cleanly():
        from sparsetool.bench.run import kernel_names, run_bench
        from sparsetool.models.open import resolve_device

        with usage_errors():  # a --kernel this device does not have
            kernel_names(resolve_device(device).type, value_of(dtype), kernel)
        with progress_bar(enabled=not (as_json or quiet)) as progress:
            mats, source, label, note = _matrices(
                checkpoint=checkpoint,
                model=value_of(model),
                shape=shape,
                levels=levels,
                pattern=value_of(pattern),
                seed=seed,
                include=include,
                exclude=exclude,
                default_targets=default_targets,
                progress=progress,
            )
            result = run_bench(
                mats,
                source=source,
                label=label,
                batches=batches,
                device=device,
                dtype=value_of(dtype),
                kernels=kernel,
                repeats=repeats,
                threads=n_threads,
                seed=seed,
                plot=plot,
                progress=progress,
            )
        targeting_note(note, quiet)
    note_reclaimed(result.reclaimed)
    if as_json:
        emit_json(result)
    else:
        _render(result, quiet)
    if result["failed"]:  # after the output, which shows them: one error line, exit 1
        _fail_wrong(result["failed"])


def _matrices(
    *,
    checkpoint: Path | None,
    model: str | None,
    shape: str | None,
    levels: list[float] | None,
    pattern: str,
    seed: int,
    include: list[str],
    exclude: list[str],
    default_targets: bool,
    progress: Any,
) -> tuple[Any, str, str, str | None]:
    """The matrices to time (a checkpoint's, one shape's or a preset's), the source's kind, its
    label and the checkpoint's targeting note."""
    from sparsetool.bench import matrices

    if checkpoint is not None:
        counting = (lambda i, n, _: progress("reading", i, n)) if progress else None
        mats, targeting = matrices.from_checkpoint(
            checkpoint,
            include=include,
            exclude=exclude,
            default_targets=default_targets,
            progress=counting,
        )
        return mats, "checkpoint", str(checkpoint), (targeting or {}).get("note")
    if levels is None:  # _check_usage gave --model and --shape a sparsity
        raise AssertionError("no sparsity to time")
    if shape is not None:
        mats = matrices.from_shape(options.parse_shape(shape), levels, pattern, seed)
        return mats, "shape", f"{shape} layer, {pattern} mask", None
    if model is None:  # _check_usage gave one of CHECKPOINT, --model and --shape
        raise AssertionError("nothing to time")
    from sparsetool.flops.presets import get_preset

    mats = matrices.from_model(get_preset(model), levels, seed)
    return mats, "model", f"{model}, random masks", None


def _fail_wrong(failed: list[dict[str, Any]]) -> None:
    """A kernel whose product is wrong: one error line naming the first, exit 1."""
    f, more = failed[0], len(failed) - 1
    with failing_cleanly():
        fail(
            f"{f['kernel']} on {f['name']} at batch {f['batch']} does not equal the float32 "
            f"product of the same values{f' (and {more} more)' if more else ''}; its times "
            "are not a speed-up: leave it out with --kernel, and report it"
        )


def _check_usage(
    checkpoint: Path | None,
    model: str | None,
    shape: str | None,
    sparsity: list[float] | None,
    pattern: str,
    include: list[str],
    exclude: list[str],
    default_targets: bool,
    kernel: list[str],
) -> None:
    """How the options combine: exit 2 before anything is read or torch is imported."""
    given = [
        n for n, v in (("CHECKPOINT", checkpoint), ("--model", model), ("--shape", shape)) if v
    ]
    if len(given) != 1:
        usage_error(
            "give a CHECKPOINT, --model PRESET --sparsity S or --shape MxK --sparsity S"
            if not given
            else f"{given[0]} and {given[1]} both say what to time; give one"
        )
    if checkpoint is not None:
        conflicting(
            sparsity is not None,
            str(checkpoint),
            "--sparsity",
            "a checkpoint is timed with its own masks; drop --sparsity, or time --model "
            "or --shape at a sparsity",
        )
    elif sparsity is None:
        usage_error(f"{given[0]} needs --sparsity, e.g. --sparsity 0.5 or 0.5,0.7,0.9")
    else:
        for what, v in (
            ("--include", include),
            ("--exclude", exclude),
            ("--default-targets", default_targets),
        ):
            conflicting(bool(v), given[0], what, f"{what} chooses a checkpoint's tensors; drop it")
    conflicting(
        pattern != "random" and shape is None,
        given[0],
        f"--pattern {pattern}",
        "--pattern shapes the mask of --shape only; drop it",
    )
    if pattern == "2:4" and shape is not None:
        k = options.parse_shape(shape)[1]
        if k % 4:
            usage_error(
                f"--pattern 2:4 keeps 2 of every 4 weights along K: --shape {shape} has "
                f"K = {k}, not a multiple of 4"
            )
        if sparsity is not None and any(abs(s - 0.5) > 1e-12 for s in sparsity):
            usage_error("--pattern 2:4 keeps exactly half the weights: use --sparsity 0.5")
    for name in kernel:
        if name not in KERNELS:
            usage_error(f"--kernel {name}: choose from {', '.join(KERNELS)}")


def _t(s: float) -> str:
    for unit, f in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= f or unit == "us":
            return f"{s / f:.3g} {unit}"
    return f"{s:g} s"


def _cell(e: dict[str, Any]) -> str:
    spread = (e["high_s"] - e["low_s"]) / 2 / e["median_s"] if e["median_s"] > 0 else 0.0
    x = f"  {e['speedup']:.2f}x" if "speedup" in e else ""
    wrong = "" if e["ok"] else " WRONG"
    return f"{_t(e['median_s'])} ±{spread:.0%}{x}{wrong}"


def _render(res: dict[str, Any], quiet: bool) -> None:
    d = res["device"]
    console.print(
        f"[bold]{escape(res['label'])}[/] on {escape(d['name'])}, {d['threads']} "
        f"thread{'' if d['threads'] == 1 else 's'}, {res['dtype']}",
        highlight=False,
        soft_wrap=True,
    )
    kernels = res["kernels"]
    sweep = bool(res["break_even"])
    for ly in res["layers"]:
        shape = f"{ly['shape'][0]}x{ly['shape'][1]}"
        title = (
            ("" if ly["name"] == shape else f"{ly['name']} ") + f"{shape}, sparsity "
            f"{ly['sparsity']:.3f}"
            + (
                f", stands for {plural(ly['count'], 'matrix', 'matrices')}"
                if ly["count"] > 1
                else ""
            )
            + ": median time ±half the spread, speed-up over dense"
        )
        rows = [
            [
                str(r["batch"]),
                f"{_cell(r['dense'])} {r['dense']['kernel']}",
                *[_cell(r["sparse"][k]) if k in r["sparse"] else "-" for k in kernels],
                r["best"] or "-",
            ]
            for r in ly["runs"]
        ]
        if not sweep:
            print_table(["batch", "dense", *kernels, "fastest sparse"], rows, title=title)
    if sweep:
        _render_sweep(res)
    for m in res["model"]:
        if res["source"] == "shape":
            break
        rows = [
            [
                str(r["batch"]),
                _t(r["dense_s"]),
                "-" if r["sparse_s"] is None else _t(r["sparse_s"]),
                "-" if r["speedup"] is None else f"{r['speedup']:.2f}x",
                _t(r["mixed_s"]),
                f"{r['mixed_speedup']:.2f}x",
            ]
            for r in m["batches"]
        ]
        print_table(
            ["batch", "dense", "sparse", "speed-up", "faster of the two", "speed-up"],
            rows,
            title=f"the whole model per token ({m['matrices']} targeted matrices, sparsity "
            f"{m['sparsity']:.3f}): dense, the fastest sparse kernel, each shape on "
            "the faster of dense and sparse",
        )
    if not quiet:
        for note in res["notes"]:
            console.print(f"note: {escape(note)}", highlight=False, soft_wrap=True)
        for k, why in res["skipped"].items():
            console.print(
                f"note: {escape(k)} not timed: {escape(why)}", highlight=False, soft_wrap=True
            )
    if res["plot"]:
        console.print(f"plot written to {escape(res['plot'])}", highlight=False, soft_wrap=True)
    console.print(f"[bold]verdict:[/] {escape(res['verdict'])}", highlight=False, soft_wrap=True)


def _render_sweep(res: dict[str, Any]) -> None:
    shapes: dict[tuple[int, ...], list[dict[str, Any]]] = {}
    for ly in res["layers"]:
        shapes.setdefault(tuple(ly["shape"]), []).append(ly)
    for shape, lys in shapes.items():
        lys = sorted(lys, key=lambda ly: ly["sparsity"])
        rows = []
        for ly in lys:
            rows.append(
                [
                    f"{ly['sparsity']:.3f}",
                    *[
                        "-" if r["best"] is None else f"{r['best_speedup']:.2f}x {r['best']}"
                        for r in ly["runs"]
                    ],
                ]
            )
        be = {
            r["batch"]: r
            for r in res["break_even"]
            if r["kernel"] == "best" and tuple(r["shape"]) == shape
        }
        rows.append(["break-even", *[_break_even(be.get(b)) for b in res["batches"]]])
        print_table(
            ["sparsity", *[f"batch {b}" for b in res["batches"]]],
            rows,
            title=f"{shape[0]}x{shape[1]}: speed-up of the fastest sparse kernel over dense",
        )


def _break_even(r: dict[str, Any] | None) -> str:
    if r is None:
        return "-"
    if r["status"] == "crossed":
        return f"{r['sparsity']:.1%}"
    return "below all timed" if r["status"] == "always" else "above all timed"
