"""``sparsetool flops``: Chinchilla Appendix-F FLOPs, dense vs sparse (as the SPDF paper counts)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import typer

from sparsetool.cli._output import (
    console,
    emit_json,
    failing_cleanly,
    percent,
    print_table,
    short_count,
    si,
    warn,
)
from sparsetool.cli._params import (
    alone,
    choice_option,
    choices,
    conflicting,
    default_targets_option,
    exclude_option,
    include_option,
    json_option,
    quiet_option,
    sparsities_option,
    stage_option,
    tokens_option,
    usage_error,
    usage_errors,
    value_of,
)
from sparsetool.errors import ShapeError
from sparsetool.flops.presets import PRESETS
from sparsetool.util.wording import plural

EXAMPLES = (  # the end of --help: each runs as written (given the files named)
    "sparsetool flops --model gpt3-xl --sparsity 0.75",
    "sparsetool flops --model cerebras-gpt-256m --stage 0.9:0.8333 --stage 0:0.1667",
    "sparsetool flops --model mixtral-8x7b --sparsity 0.5",
)


if TYPE_CHECKING:  # a str Enum to the type checker; typer reads the choices made below
    from sparsetool.cli._params import Choice as Preset
else:
    Preset = choices("Preset", PRESETS)


OPTION: dict[str, Any] = {
    "model": choice_option(
        Preset,
        None,
        "--model",
        "-m",
        case_sensitive=False,
        help="A preset (--list shows their shapes).",
    ),
    "config": typer.Option(
        None,
        "--config",
        help="Model shapes from a TOML/JSON/YAML file or a Hugging Face config.json.",
    ),
    "checkpoint": typer.Option(
        None,
        "--checkpoint",
        help="Infer shapes from a checkpoint (file or directory) and use each targeted tensor's "
        "measured sparsity.",
    ),
    "sparsity": sparsities_option(
        "Fraction of zeros in the targeted matmuls; several as 0,0.5,0.75 give one table "
        "[default: 0,0.5,0.75]."
    ),
    "stage": stage_option(
        "Variable SPDF stage SPARSITY:FRACTION of the token budget (repeatable; fractions sum to "
        "1)."
    ),
    "tokens": tokens_option(
        "--tokens",
        "Pre-training tokens, e.g. 26B, 2.6e10 or 300M [default: 20 per parameter, Chinchilla].",
    ),
    "seq_len": typer.Option(
        None, "--seq-len", min=1, help="Sequence length [default: the model's]."
    ),
    "vocab": typer.Option(None, "--vocab", min=1, help="Vocabulary size [default: the model's]."),
    "embeddings": typer.Option(
        False, "--embeddings", help="Count the embedding term 2*s*V*d (the SPDF tables do not)."
    ),
    "finetune_tokens": tokens_option(
        "--finetune-tokens", "Add dense fine-tuning on this many tokens, e.g. 64.5M.", minimum=0
    ),
    "finetune_seq_len": typer.Option(
        None, "--finetune-seq-len", min=1, help="Fine-tuning sequence length [default: --seq-len]."
    ),
    "breakdown": typer.Option(
        False, "--breakdown", help="Show every Appendix-F term with its formula."
    ),
    "include": include_option(
        "With --checkpoint: also count tensors matching this glob as targeted (repeatable)."
    ),
    "exclude": exclude_option(
        "With --checkpoint: do not count tensors matching this glob as targeted (repeatable; "
        "wins over --include)."
    ),
    "default_targets": default_targets_option(),
    "list_presets": typer.Option(False, "--list", help="List the model presets and exit."),
    "quiet": quiet_option(),
    "as_json": json_option(
        'Print the numbers as JSON: {"model", "config", ..., "runs": [one per sparsity]}.'
    ),
}
"""Each option of the command, made once."""


def flops(
    model: Preset | None = OPTION["model"],
    config: Path | None = OPTION["config"],
    checkpoint: Path | None = OPTION["checkpoint"],
    sparsity: str | None = OPTION["sparsity"],
    stage: list[str] = OPTION["stage"],
    tokens: str | None = OPTION["tokens"],
    seq_len: int | None = OPTION["seq_len"],
    vocab: int | None = OPTION["vocab"],
    embeddings: bool = OPTION["embeddings"],
    finetune_tokens: str | None = OPTION["finetune_tokens"],
    finetune_seq_len: int | None = OPTION["finetune_seq_len"],
    breakdown: bool = OPTION["breakdown"],
    include: list[str] = OPTION["include"],
    exclude: list[str] = OPTION["exclude"],
    default_targets: bool = OPTION["default_targets"],
    list_presets: bool = OPTION["list_presets"],
    quiet: bool = OPTION["quiet"],
    as_json: bool = OPTION["as_json"],
) -> None:
    """Training and inference FLOPs, dense vs sparse, by Chinchilla Appendix F.

    Forward FLOPs per sequence are summed term by term (QKV, attention logits, softmax,
    attention over values, output projection, FFN, final logits; embeddings only with
    --embeddings); weight sparsity scales only QKV, attention output and FFN. Training =
    3 x forward per sequence, over tokens / seq-len sequences.
    """
    from sparsetool import flops as F

    levels_given = cast("list[float] | None", sparsity)  # --sparsity's callback parsed the text
    _check_listing(as_json, breakdown)
    if list_presets:
        _print_presets(F, as_json)
        return
    _check_sources(
        F,
        model=model,
        config=config,
        checkpoint=checkpoint,
        levels_given=levels_given,
        stage=stage,
        include=include,
        exclude=exclude,
        default_targets=default_targets,
        finetune_tokens=finetune_tokens,
        finetune_seq_len=finetune_seq_len,
    )
    with usage_errors():
        stages = F.check_stages([F.Stage(*st) for st in stage]) if stage else []
    common: dict[str, Any] = dict(
        tokens=tokens,
        embeddings=embeddings,
        finetune_tokens=finetune_tokens or 0,
        finetune_seq_len=finetune_seq_len,
    )
    notes: list[str] = []
    measured = None
    with failing_cleanly():
        if checkpoint is not None:
            measured = _infer(
                F,
                checkpoint,
                include=include,
                exclude=exclude,
                seq_len=seq_len,
                vocab=vocab,
                default_targets=default_targets,
                quiet=quiet,
                show_progress=not (as_json or quiet),
            )
            cfg = measured.config
            notes = list(measured.notes)
            results = [
                F.account(cfg, sparsity=measured.layer_sparsity, params=measured.params, **common)
            ]
        else:
            cfg = F.with_overrides(_model_config(F, model, config), seq_len=seq_len, vocab=vocab)
            results = _runs(F, cfg, stages, levels_given, common)
    warnings = F.input_warnings(results)
    if as_json:
        emit_json(F.json_result(cfg, results, measured, warnings))
        return
    if not quiet:
        for w in warnings:
            warn(w)
    _render(F, cfg, results, [] if quiet else notes, breakdown, measured is not None)


def _check_listing(as_json: bool, breakdown: bool) -> None:
    """What --list and --json refuse beside them (exit 2)."""
    alone(
        "list_presets",
        ("as_json", "quiet"),
        "--list prints the presets and counts nothing",
        "drop --list to count FLOPs",
    )
    conflicting(
        as_json and breakdown,
        "--json",
        "--breakdown",
        '--json always holds every term ("forward_terms", "dense_forward_terms" of each '
        "run); drop --breakdown, or drop --json for the table of terms with their formulas",
    )


def _check_sources(
    F: Any,
    *,
    model: Preset | None,
    config: Path | None,
    checkpoint: Path | None,
    levels_given: list[float] | None,
    stage: list[str],
    include: list[str],
    exclude: list[str],
    default_targets: bool,
    finetune_tokens: str | None,
    finetune_seq_len: int | None,
) -> None:
    """One model source, and the options that go with it (exit 2 before anything is read)."""
    sources = [x for x in (model, config, checkpoint) if x is not None]
    if len(sources) != 1:
        usage_error(
            "give exactly one of --model NAME, --config FILE or --checkpoint PATH "
            f"(presets: {', '.join(F.PRESETS)})"
        )
    if (include or exclude or default_targets) and checkpoint is None:
        usage_error("--include/--exclude/--default-targets only apply with --checkpoint")
    if stage and levels_given is not None:
        usage_error(
            f"--stage replaces --sparsity: drop --sparsity {sparsity_text(levels_given)} (the "
            "stages give each sparsity), or drop --stage"
        )
    if checkpoint is not None and (levels_given is not None or stage):
        usage_error(
            f"--checkpoint uses the measured sparsity; drop {'--stage' if stage else '--sparsity'}"
        )
    if finetune_seq_len is not None and finetune_tokens is None:
        usage_error(
            f"--finetune-seq-len {finetune_seq_len} sets the length of dense fine-tuning, which "
            "only --finetune-tokens adds: give both, e.g. --finetune-tokens 64.5M "
            f"--finetune-seq-len {finetune_seq_len}"
        )


def _infer(
    F: Any,
    checkpoint: Path,
    *,
    include: list[str],
    exclude: list[str],
    seq_len: int | None,
    vocab: int | None,
    default_targets: bool,
    quiet: bool,
    show_progress: bool,
) -> Any:
    """The checkpoint's shapes and measured sparsity (an ``InferredModel``), its targeting noted
    unless ``quiet``; a missing shape's error says the way out."""
    from sparsetool.cli._output import progress_bar, targeting_note

    with progress_bar(show_progress) as progress:
        try:
            measured = F.from_checkpoint(
                checkpoint,
                include=tuple(include),
                exclude=tuple(exclude),
                seq_len=seq_len,
                vocab=vocab,
                progress=progress,
                default_targets=default_targets,
            )
        except ShapeError as e:  # the library says what is missing; the way out is ours
            hint = (
                "pass --vocab V"
                if e.missing == "vocab"
                else "describe the model with --config FILE instead of --checkpoint"
            )
            raise ShapeError(f"{e}; {hint}") from None
    targeting_note(measured.targeting.get("note"), quiet)
    return measured


def _model_config(F: Any, model: Preset | None, config: Path | None) -> Any:
    """The preset or config file's model (one of them given, as checked)."""
    if model is not None:
        return F.get_preset(value_of(model))
    if config is None:  # one of --model, --config, --checkpoint (checked above)
        raise AssertionError("no model, config or checkpoint")
    return F.load_config(config)


def _runs(
    F: Any,
    cfg: Any,
    stages: list[Any],
    levels_given: list[float] | None,
    common: dict[str, Any],
) -> list[dict]:
    """One staged run, or one run per sparsity (0, 0.5 and 0.75 when none is given)."""
    if stages:
        return [F.account(cfg, stages=stages, **common)]
    levels = levels_given if levels_given is not None else [0.0, 0.5, 0.75]
    return [F.account(cfg, sparsity=s, **common) for s in levels]


def sparsity_text(levels: list[float]) -> str:
    return ",".join(f"{x:g}" for x in levels)


def _e(x: float) -> str:
    return f"{x:.3e}"


def _f(x: float) -> str:
    return si(x, "FLOP")


def _title(F: Any, cfg: Any, r: dict) -> str:
    src = "20 tokens/param, Chinchilla" if r["tokens_source"] == "chinchilla" else "given"
    emb = "embeddings counted" if r["embeddings"] else "embeddings excluded"
    kv = f" ({cfg.n_kv_heads} kv)" if cfg.n_kv_heads else ""
    swiglu = " (SwiGLU)" if cfg.ffn_matrices == 3 else ""
    if cfg.is_moe:
        ffn = (
            f"{cfg.n_experts} experts of d_ff {cfg.expert_width}{swiglu}, {cfg.top_k} per token"
            + (f", shared expert d_ff {cfg.d_shared}" if cfg.d_shared else "")
            + (
                f", {plural(len(cfg.dense_layers), 'dense layer')} of d_ff {cfg.d_ff}"
                if cfg.dense_layers
                else ""
            )
        )
    else:
        ffn = f"d_ff {cfg.d_ff}{swiglu}"
    head = str(cfg.d_head)
    if cfg.is_mla:
        head += (
            f" (latent attention: {f'q rank {cfg.q_rank}, ' if cfg.q_rank else ''}kv rank "
            f"{cfg.kv_rank}, rotary {cfg.d_rope}, values {cfg.value_head})"
        )
    return (
        f"{cfg.name}: {plural(cfg.n_layers, 'layer')}, d_model {cfg.d_model}, "
        f"{plural(cfg.n_heads, 'head')}{kv} x "
        f"{head}, {ffn}, vocab "
        f"{cfg.vocab}, {F.seq_len_note(cfg)}\n{short_count(r['tokens'])} training tokens ({src}), "
        f"{r['sequences']:.4g} sequences; {emb}"
    )


def _moe_note(cfg: Any, r: dict) -> str:
    """What a mixture of experts' figures count."""
    shared = " and the shared expert" if cfg.d_shared else ""
    return (
        f"mixture of experts: FLOPs count the {cfg.top_k} of {cfg.n_experts} experts each token "
        f"goes through{shared}, plus the router; total parameters "
        f"{short_count(r['params'])} hold every expert, active parameters "
        f"{short_count(r['active_params'])} are one token's share"
    )


def _render(
    F: Any, cfg: Any, results: list[dict], notes: list[str], breakdown: bool, measured: bool
) -> None:
    """The notes, then the table of several runs or of one."""
    from rich.markup import escape

    for n in notes:
        console.print(f"[dim]note: {escape(n)}[/]", highlight=False, soft_wrap=True)
    if len(results) > 1:
        _render_runs(F, cfg, results, breakdown)
    else:
        _render_run(F, cfg, results[0], breakdown, measured)


def _render_runs(F: Any, cfg: Any, results: list[dict], breakdown: bool) -> None:
    """Several sparsities: one row each, what the columns are, then each run's terms."""
    from rich.markup import escape

    r0 = results[0]
    ft = r0["finetune_tokens"] > 0
    console.print(escape(_title(F, cfg, r0)), highlight=False, soft_wrap=True)
    cols = ["sparsity", "FLOPs/seq", "training", "vs dense", "infer/token", "non-zero"]
    if cfg.is_moe:
        cols += ["active non-zero"]
    if ft:
        cols += ["+FT", "e2e speed-up"]
    rows: list[list[str]] = []
    for r in results:
        row = [
            percent(r["sparsity"], 1),
            _f(r["train_flops_per_seq"]),
            _f(r["total_train_flops"]),
            f"{r['train_flops_ratio']:.3f}x",
            _f(r["inference_flops_per_token"]),
            short_count(r["nonzero_params"]),
        ]
        if cfg.is_moe:
            row += [short_count(r["active_nonzero_params"])]
        if ft:
            row += [_f(r["end_to_end_flops"]), f"{1 / r['end_to_end_ratio']:.2f}x"]
        rows.append(row)
    print_table(cols, rows, align="r" * len(cols))
    console.print(
        "FLOPs/seq: training (3 x forward); training: FLOPs over all training tokens; vs "
        "dense: sparse/dense; infer/token: inference FLOPs per token; non-zero: parameters"
        + ("; active non-zero: of the experts one token goes through" if cfg.is_moe else "")
        + ("; +FT: with dense fine-tuning; e2e speed-up: dense/sparse" if ft else ""),
        highlight=False,
        soft_wrap=True,
    )
    if cfg.is_moe:
        console.print(_moe_note(cfg, r0), highlight=False, soft_wrap=True)
    if ft:
        console.print(
            f"fine-tuning: {short_count(r0['finetune_tokens'])} tokens at seq "
            f"{r0['finetune_seq_len']}, {_f(r0['finetune_forward_flops_per_seq'])} "
            f"forward per sequence, {_f(r0['finetune_flops'])} (dense)",
            highlight=False,
            soft_wrap=True,
        )
    if breakdown:
        for r in results:
            _render_breakdown(F, cfg, r)


def _render_run(F: Any, cfg: Any, r: dict, breakdown: bool, measured: bool) -> None:
    """One run (a staged run's stages first): dense against sparse, figure by figure."""
    from rich.markup import escape

    ft = r["finetune_tokens"] > 0
    console.print(escape(_title(F, cfg, r)), highlight=False, soft_wrap=True)
    if r["stages"]:
        print_table(
            ("stage", "sparsity", "fraction", "tokens", "training"),
            [
                [
                    str(i),
                    percent(s["sparsity"], 1),
                    f"{s['fraction']:.4f}",
                    short_count(s["tokens"]),
                    _f(s["train_flops"]),
                ]
                for i, s in enumerate(r["stages"], 1)
            ],
            title="Variable SPDF stages",
            align="rrrrr",
        )
    label = ("measured " if measured else "effective " if r["stages"] else "sparse ") + percent(
        r["sparsity"], 1
    )
    rows = []

    def add(name: str, dense: float, sparse: float, fmt: Any = _f) -> None:
        ratio = sparse / dense if dense else 1.0
        rows.append(
            [name, fmt(dense), fmt(sparse), f"{ratio:.3f}", f"{1 / ratio:.2f}x" if ratio else "inf"]
        )

    add("forward FLOPs / sequence", r["dense_forward_flops_per_seq"], r["forward_flops_per_seq"])
    add("training FLOPs / sequence", r["dense_train_flops_per_seq"], r["train_flops_per_seq"])
    add("training FLOPs, all tokens", r["dense_total_train_flops"], r["total_train_flops"])
    if ft:
        rows.append(
            [
                f"dense fine-tuning FLOPs ({short_count(r['finetune_tokens'])} tok, seq "
                f"{r['finetune_seq_len']})",
                _f(r["finetune_flops"]),
                _f(r["finetune_flops"]),
                "",
                "",
            ]
        )
        add("end-to-end FLOPs", r["dense_end_to_end_flops"], r["end_to_end_flops"])
    add(
        "inference FLOPs / token",
        r["dense_inference_flops_per_token"],
        r["inference_flops_per_token"],
    )
    count = lambda x: f"{x:,.0f}"  # noqa: E731
    moe = cfg.is_moe
    add("total parameters" if moe else "parameters", r["params"], r["params"], count)
    add("non-zero parameters", r["params"], r["nonzero_params"], count)
    if moe:
        add("active parameters / token", r["active_params"], r["active_params"], count)
        add("active non-zero / token", r["active_params"], r["active_nonzero_params"], count)
    print_table(["", "dense", label, "sparse/dense", "dense/sparse"], rows)
    if moe:
        console.print(_moe_note(cfg, r), highlight=False, soft_wrap=True)
    if r["stages"]:
        console.print(
            "inference FLOPs and non-zero parameters are those of the model the last stage "
            f"ends with ({percent(r['stages'][-1]['sparsity'], 1)} sparse)",
            highlight=False,
            soft_wrap=True,
        )
    if breakdown:
        _render_breakdown(F, cfg, r)


def _render_breakdown(F: Any, cfg: Any, r: dict) -> None:
    formulas = F.term_formulas(cfg)
    dense, sparse = r["dense_forward_terms"], r["forward_terms"]
    total_d, total_s = sum(dense.values()), sum(sparse.values())
    title = (
        f"forward FLOPs of one sequence, term by term (sparse = {percent(r['sparsity'], 1)}"
        f"{', last stage' if r['stages'] else ''})"
    )
    rows: list[list[str]] = []
    sections: list[int] = []
    for name in F.TERMS:
        if name == "embeddings":
            sections.append(len(rows))
        if name == "router" and not cfg.is_moe:
            continue
        if name == "embeddings" and not r["embeddings"]:
            rows.append([name, formulas[name], "excluded", "", "excluded"])
            continue
        mark = " *" if name in F.TARGETED_TERMS else ""
        rows.append(
            [
                name + mark,
                formulas[name],
                _e(dense[name]),
                percent(dense[name] / total_d, 1),
                _e(sparse[name]),
            ]
        )
    rows.append(["forward", "sum", _e(total_d), "100.0%", _e(total_s)])
    rows.append(
        ["training", "3 x forward (backward = 2 x forward)", _e(3 * total_d), "", _e(3 * total_s)]
    )
    print_table(
        ("term", "formula (dense)", "dense", "share", "sparse"),
        rows,
        title=title,
        align="llrrr",
        sections=sections,
    )
    console.print(
        "* scaled by (1 - sparsity) of its weights; ffn = "
        f"{plural(cfg.ffn_matrices, 'matrix', 'matrices')}"
        f"{' (gate, up, down)' if cfg.ffn_matrices == 3 else ' (in, out)'}"
        + (
            f" of each of the {cfg.top_k} experts a token goes through"
            + (" and of the shared expert" if cfg.d_shared else "")
            + "; router: the dense routing matmul"
            if cfg.is_moe
            else ""
        )
        + (
            "; qkv = latent attention's "
            + ", ".join(n for n, _ in F.qkv_matrices(cfg))
            + " matrices"
            if cfg.is_mla
            else ""
        ),
        highlight=False,
        soft_wrap=True,
    )
    keys = F.keys_per_query(cfg)
    if keys != cfg.seq_len:
        console.print(
            f"attention terms count {keys:,} keys per query, not {cfg.seq_len:,}: the model's "
            f"sliding window is {cfg.window:,} tokens",
            highlight=False,
            soft_wrap=True,
        )
    elif cfg.window:
        console.print(
            f"the model's sliding window ({cfg.window:,} tokens) is no shorter than the "
            f"sequence, so every query attends to all {cfg.seq_len:,} keys",
            highlight=False,
            soft_wrap=True,
        )
    if cfg.embed_dim:
        console.print(
            f"embedding and LM head are {cfg.embed_dim} wide: logits and embeddings include "
            f"the project_out/project_in matmuls 2*s*{cfg.d_model}*{cfg.embed_dim}",
            highlight=False,
            soft_wrap=True,
        )


def _print_presets(F: Any, as_json: bool) -> None:
    from dataclasses import asdict

    if as_json:
        emit_json({name: asdict(c) for name, c in F.PRESETS.items()})
        return
    rows = []
    for name, c in F.PRESETS.items():
        p = F.param_counts(c)
        rows.append(
            [
                name,
                str(c.n_layers),
                str(c.d_model),
                str(c.n_heads),
                str(c.d_head),
                str(c.expert_width),
                "SwiGLU" if c.ffn_matrices == 3 else "GELU",
                f"{c.top_k} of {c.n_experts}" if c.is_moe else "-",
                str(c.vocab),
                str(c.seq_len),
                short_count(p["total"]),
                short_count(p["active"]),
            ]
        )
    print_table(
        (
            "name",
            "layers",
            "d_model",
            "heads",
            "d_head",
            "d_ff",
            "FFN",
            "experts",
            "vocab",
            "seq",
            "params",
            "active",
        ),
        rows,
        title="model presets",
    )
    console.print(
        "d_ff: of one expert for a mixture of experts; params: all of them; active: "
        "those one token goes through",
        highlight=False,
        soft_wrap=True,
    )
