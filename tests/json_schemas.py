"""The schema of every command's ``--json`` output (README "JSON output"), and a small checker.

A schema is written with four helpers: ``obj(key=schema, ...)`` is an object with exactly these
keys (no more, no fewer); ``arr(schema)`` a list whose items all match; ``mapping(schema)`` an
object with any keys whose values all match; a string or tuple of strings names the JSON types
allowed (``"str"``, ``"int"``, ``"num"`` (int or float), ``"bool"``, ``"null"``, ``"any"``).
``problems(value, schema)`` lists every place ``value`` differs; an empty list means it conforms.
"""

from __future__ import annotations

from typing import Any

_TYPES = {
    "str": (str,),
    "int": (int,),
    "num": (int, float),
    "bool": (bool,),
    "null": (type(None),),
    "list": (list,),
    "dict": (dict,),
}


class obj(dict):
    """An object with exactly these keys."""

    def __init__(self, **keys: Any) -> None:
        super().__init__(keys)


class arr:
    def __init__(self, item: Any) -> None:
        self.item = item


class mapping:
    def __init__(self, value: Any) -> None:
        self.value = value


class nullable:
    """``schema`` or null."""

    def __init__(self, schema: Any) -> None:
        self.schema = schema


def problems(value: Any, schema: Any, where: str = "$") -> list[str]:
    if isinstance(schema, nullable):
        return [] if value is None else problems(value, schema.schema, where)
    if isinstance(schema, obj):
        if not isinstance(value, dict):
            return [f"{where}: expected an object, got {type(value).__name__}"]
        out = [f"{where}: missing key '{k}'" for k in schema if k not in value]
        out += [f"{where}: unexpected key '{k}'" for k in value if k not in schema]
        for k, sub in schema.items():
            if k in value:
                out += problems(value[k], sub, f"{where}.{k}")
        return out
    if isinstance(schema, arr):
        if not isinstance(value, list):
            return [f"{where}: expected a list, got {type(value).__name__}"]
        return [p for i, v in enumerate(value) for p in problems(v, schema.item, f"{where}[{i}]")]
    if isinstance(schema, mapping):
        if not isinstance(value, dict):
            return [f"{where}: expected an object, got {type(value).__name__}"]
        return [p for k, v in value.items() for p in problems(v, schema.value, f"{where}.{k}")]
    names = (schema,) if isinstance(schema, str) else tuple(schema)
    if "any" in names:
        return []
    ok = any(
        isinstance(value, _TYPES[n]) and not (isinstance(value, bool) and n in ("int", "num"))
        for n in names
    )
    return [] if ok else [f"{where}: expected {' or '.join(names)}, got {value!r}"]


NUM, INT, STR, BOOL = "num", "int", "str", "bool"
OPT_NUM, OPT_STR = (NUM, "null"), (STR, "null")

TARGETING = obj(rule=STR, include=arr(STR), exclude=arr(STR), note=OPT_STR, tied_head=OPT_STR)

# --- flops ------------------------------------------------------------------------------------
MODEL_CONFIG = obj(
    name=STR,
    n_layers=INT,
    d_model=INT,
    n_heads=INT,
    d_head=INT,
    d_ff=INT,
    vocab=INT,
    seq_len=INT,
    ffn_matrices=INT,
    n_kv_heads=(INT, "null"),
    learned_positions=BOOL,
    tied_embeddings=BOOL,
    biases=BOOL,
    nominal_params=OPT_NUM,
    context=(INT, "null"),
    position_rows=(INT, "null"),
    window=(INT, "null"),
    embed_dim=(INT, "null"),
    final_norm=BOOL,
    n_experts=(INT, "null"),
    top_k=(INT, "null"),
    d_expert=(INT, "null"),
    d_shared=INT,
    shared_gate=BOOL,
    dense_layers=arr(INT),
    router_bias=BOOL,
    kv_rank=(INT, "null"),
    q_rank=(INT, "null"),
    d_rope=INT,
    d_v=(INT, "null"),
    seq_len_source=STR,
)
MOE = obj(
    experts=INT,
    top_k=INT,
    expert_width=INT,
    shared_width=INT,
    moe_layers=INT,
    dense_layers=arr(INT),
)
FLOPS_RUN = obj(
    model=STR,
    seq_len=INT,
    vocab=INT,
    embeddings=BOOL,
    tokens=NUM,
    tokens_source=STR,
    sequences=NUM,
    sparsity=NUM,
    effective_sparsity=NUM,
    stages=nullable(arr(obj(sparsity=NUM, fraction=NUM, tokens=NUM, train_flops=NUM))),
    forward_flops_per_seq=NUM,
    dense_forward_flops_per_seq=NUM,
    train_flops_per_seq=NUM,
    dense_train_flops_per_seq=NUM,
    total_train_flops=NUM,
    dense_total_train_flops=NUM,
    train_flops_ratio=NUM,
    inference_flops_per_token=NUM,
    dense_inference_flops_per_token=NUM,
    inference_flops_ratio=NUM,
    params=NUM,
    nonzero_params=NUM,
    dense_params=NUM,
    dense_nonzero_params=NUM,
    nonzero_params_ratio=NUM,
    active_params=NUM,
    active_nonzero_params=NUM,
    finetune_tokens=NUM,
    finetune_seq_len=INT,
    finetune_forward_flops_per_seq=NUM,
    finetune_flops=NUM,
    end_to_end_flops=NUM,
    dense_end_to_end_flops=NUM,
    end_to_end_ratio=NUM,
    forward_terms=mapping(NUM),
    dense_forward_terms=mapping(NUM),
)
FLOPS = obj(
    model=STR,
    config=MODEL_CONFIG,
    moe=nullable(MOE),
    notes=arr(STR),
    warnings=arr(STR),
    targeted_sparsity=OPT_NUM,
    targeting=nullable(TARGETING),
    runs=arr(FLOPS_RUN),
)
FLOPS_LIST = mapping(MODEL_CONFIG)

# --- simulate ---------------------------------------------------------------------------------
SPEEDUPS = obj(kind=STR, forward_speedup=OPT_NUM, train_speedup=OPT_NUM, forward_time_s=OPT_NUM)
SIM_RUN = obj(sparsity=NUM, theoretical=OPT_NUM, devices=mapping(SPEEDUPS))
_COST = dict(
    time_s=NUM,
    dense_time_s=NUM,
    speedup=OPT_NUM,
    theoretical=OPT_NUM,
    breakdown=obj(compute=NUM, memory=NUM, fixed=NUM, imbalance=NUM),
    untargeted_s=NUM,
    speedup_if_balanced=OPT_NUM,
)
SIM_DEVICE = obj(
    name=STR,
    kind=STR,
    applicable=BOOL,
    reason=OPT_STR,
    notes=arr(STR),
    busiest_over_mean=OPT_NUM,
    forward=nullable(obj(**_COST)),
    train_step=nullable(obj(**_COST, passes=mapping(NUM))),
)
SIM_LAYER = obj(
    name=STR,
    role=STR,
    shape=arr(INT),
    sparsity=NUM,
    nonzero=INT,
    nm_violation_in=NUM,
    nm_violation_out=NUM,
    measured=BOOL,
    busiest_over_mean=OPT_NUM,
    core_groups=nullable(arr(INT)),
    speedup=mapping(OPT_NUM),
    kernel=nullable(mapping(STR)),
)
SIM_WORKLOAD = obj(
    label=STR,
    source=STR,
    tokens=NUM,
    seq_len=(INT, "null"),
    layers=INT,
    targeted_sparsity=NUM,
    forward_flops=obj(dense=NUM, sparse=NUM),
    train_flops=obj(dense=NUM, sparse=NUM),
    untargeted_forward_flops=NUM,
    theoretical=OPT_NUM,
    notes=arr(STR),
    targeting=nullable(TARGETING),
    moe=nullable(MOE),
)
SIMULATE = obj(
    workload=SIM_WORKLOAD,
    runs=arr(SIM_RUN),
    devices=arr(SIM_DEVICE),
    layers=arr(SIM_LAYER),
    nm_point=nullable(obj(sparsity=NUM, theoretical=OPT_NUM, devices=mapping(SPEEDUPS), mask=STR)),
    plot=OPT_STR,
    verify=nullable(
        obj(
            equal=BOOL,
            max_abs_error=NUM,
            axpys=INT,
            block=arr(INT),
            core_groups=arr(INT),
            tokens=INT,
            axpys_match_tiles=BOOL,
            nonzero=INT,
        )
    ),
)
_TIMES = obj(dense_s=NUM, sparse_s=OPT_NUM, speedup=OPT_NUM)
MEASURED_ROW = obj(
    layer=STR,
    shape=arr(INT),
    sparsity=NUM,
    nnz=INT,
    batch=INT,
    measured=_TIMES,
    modelled=obj(dense_s=NUM, sparse_s=OPT_NUM, speedup=OPT_NUM),
    note=OPT_STR,
)
MEASURED_ERROR = obj(points=INT, dense=OPT_NUM, sparse=OPT_NUM, time=OPT_NUM, speedup=OPT_NUM)
SIMULATE_MEASURED = obj(
    measurement=obj(
        file=STR,
        device=obj(type=STR, name=OPT_STR, threads=(INT, "null")),
        dtype=STR,
        label=OPT_STR,
        kernels=arr(STR),
    ),
    device=obj(name=STR, kind=STR),
    kernel=STR,
    rows=arr(MEASURED_ROW),
    error=MEASURED_ERROR,
    fit=nullable(
        obj(
            constants=mapping(NUM),
            start=mapping(NUM),
            unconstrained=arr(STR),
            error_before=MEASURED_ERROR,
            error_after=MEASURED_ERROR,
            rows=arr(MEASURED_ROW),
            output=OPT_STR,
            warnings=arr(STR),
        )
    ),
)
SIMULATE_LIST = mapping(
    obj(kind=STR, constants=mapping(obj(value=("num", "bool"), unit=OPT_STR, source=STR)))
)

# --- checkpoint commands ----------------------------------------------------------------------
PRUNE = obj(
    output=STR,
    options=obj(
        sparsity=OPT_NUM,
        fraction=OPT_NUM,
        nm=OPT_STR,
        method=STR,
        scope=STR,
        distribution=STR,
        seed=INT,
        encoding=STR,
        include=arr(STR),
        exclude=arr(STR),
    ),
    tensors=arr(
        obj(name=STR, shape=arr(INT), numel=INT, nonzero_before=INT, nonzero=INT, sparsity=NUM)
    ),
    summary=obj(
        targeted_tensors=INT, targeted_numel=INT, targeted_nonzero=INT, targeted_sparsity=NUM
    ),
    warnings=arr(STR),
    notes=arr(STR),
    left_out=arr(STR),
)
DENSIFY = obj(
    output=STR, tensors=INT, decoded=mapping(INT), negative_zeros_fixed=INT, left_out=arr(STR)
)
REPORT = obj(
    tensors=arr(
        obj(
            name=STR,
            shape=arr(INT),
            dtype=STR,
            role=STR,
            targeted=BOOL,
            numel=INT,
            nonzero=INT,
            encoding=STR,
            bytes=INT,
            sparsity=NUM,
            expert=(INT, "null"),
            experts=nullable(
                obj(
                    count=INT,
                    numel=INT,
                    nonzero=arr(INT),
                    sparsity=arr(NUM),
                    min_sparsity=NUM,
                    max_sparsity=NUM,
                )
            ),
        )
    ),
    summary=obj(
        targeted_sparsity=NUM,
        overall_sparsity=NUM,
        numel=INT,
        nonzero=INT,
        targeted_numel=INT,
        targeted_nonzero=INT,
        targeted_tensors=INT,
        tensors=INT,
        bytes=INT,
        targeting=TARGETING,
        non_float_numel=INT,
        non_float_nonzero=INT,
        non_float_tensors=INT,
        non_float_dtypes=arr(STR),
    ),
    provenance=("dict", "null"),  # what made the checkpoint, as recorded; null: nothing recorded
)
# a mixture of experts' report: the spread of its experts' sparsities, per layer and kind
REPORT_EXPERTS = obj(
    tensors=REPORT["tensors"],
    summary=obj(
        **REPORT["summary"],
        experts=arr(obj(layer=INT, kind=STR, min_sparsity=NUM, max_sparsity=NUM)),
    ),
    provenance=REPORT["provenance"],
)
_STATS = dict(
    numel=INT,
    nonzero_a=INT,
    nonzero_b=INT,
    nonzero_both=INT,
    dot=NUM,
    sq_a=NUM,
    sq_b=NUM,
    sq_diff=NUM,
    sparsity_a=NUM,
    sparsity_b=NUM,
    iou=NUM,
    revived=INT,
    pruned=INT,
    rel_l2=OPT_NUM,
    angular_distance=NUM,
)
DIFF = obj(
    tensors=arr(
        obj(name=STR, part=OPT_STR, layer=(INT, "null"), kind=STR, shape=arr(INT), **_STATS)
    ),
    summary=obj(a=STR, b=STR, tensors=INT, matrices=INT, notes=arr(STR), **_STATS),
)
# the memory plan of a model-level run (eval; prune --method wanda|sparsegpt without windows_held)
MEMORY_KEYS = dict(
    peak_estimate=INT,
    fixed=INT,
    weights=INT,
    activations=INT,
    statistics=INT,
    budget=INT,
    budget_source=STR,
)
# a difference (or ratio) to the first checkpoint with its paired 95% interval (ops/paired.py)
INTERVAL = obj(estimate=NUM, low=NUM, high=NUM, items=INT, inside_noise=BOOL)
_METHOD = dict(method=STR, confidence=NUM, resamples=INT, seed=INT, over=STR)
COMPARISON_METHOD = obj(estimate=STR, **_METHOD)
EVAL = obj(
    text=STR,
    checkpoints=arr(
        obj(
            name=STR,
            kind=STR,
            targeted_sparsity=NUM,
            params=INT,
            nonzero_params=INT,
            nll=NUM,
            perplexity=NUM,
            bits_per_byte=NUM,
            tokens=INT,
            bytes=INT,
            seq=INT,
            stride=INT,
            seconds=NUM,
            change=NUM,
            tokens_per_s=NUM,
            nll_stderr=NUM,
            tokenizer=STR,
            memory=obj(windows_held=INT, **MEMORY_KEYS),
            comparison=nullable(INTERVAL),
            windows=obj(nll=arr(NUM), tokens=arr(INT)),
        )
    ),
    compare_by=STR,
    comparison=COMPARISON_METHOD,
    warnings=arr(STR),
)
TRAIN = obj(
    run_dir=STR,
    step=INT,
    steps=INT,
    finished=BOOL,
    loss=NUM,
    val_loss=OPT_NUM,
    sparsity=NUM,
    tokens=INT,
    elapsed_s=NUM,
    tokens_per_s=OPT_NUM,
    params=INT,
    world_size=INT,
    masks_identical_across_ranks=(BOOL, "null"),
    mask_updates_that_diverged=(INT, "null"),
    checkpoint=STR,
    log=STR,
    plot=OPT_STR,  # null without matplotlib
    huggingface=BOOL,
    interrupted=OPT_STR,
)

_TIMING = dict(median_s=NUM, low_s=NUM, high_s=NUM, repeats=INT, max_abs_error=NUM, ok=BOOL)
BENCH_RUN = obj(
    batch=INT,
    dense=obj(kernel=STR, **_TIMING),
    sparse=mapping(obj(speedup=NUM, **_TIMING)),
    best=OPT_STR,
    best_speedup=OPT_NUM,
)
BENCH = obj(
    bench=INT,
    device=obj(type=STR, name=STR, threads=INT, torch=STR, scipy=OPT_STR),
    dtype=STR,
    source=STR,
    label=STR,
    batches=arr(INT),
    kernels=arr(STR),
    dense_kernels=arr(STR),
    skipped=mapping(STR),
    options=obj(repeats=INT, min_time_s=NUM, seed=INT),
    layers=arr(
        obj(
            name=STR,
            shape=arr(INT),
            count=INT,
            roles=arr(STR),
            nnz=INT,
            sparsity=NUM,
            two_four=BOOL,
            runs=arr(BENCH_RUN),
            target_sparsity=OPT_NUM,
        )
    ),
    model=arr(
        obj(
            sparsity=NUM,
            target_sparsity=OPT_NUM,
            matrices=INT,
            batches=arr(
                obj(
                    batch=INT,
                    dense_s=NUM,
                    sparse_s=OPT_NUM,
                    speedup=OPT_NUM,
                    mixed_s=NUM,
                    mixed_speedup=NUM,
                    kernels=mapping(OPT_STR),
                )
            ),
        )
    ),
    break_even=arr(
        obj(
            shape=arr(INT),
            batch=INT,
            kernel=STR,
            status=STR,
            sparsity=OPT_NUM,
            best_speedup=OPT_NUM,
        )
    ),
    failed=arr(obj(name=STR, batch=INT, kernel=STR)),
    verdict=STR,
    notes=arr(STR),
    plot=OPT_STR,
)

# eval --tasks
TASKS = obj(
    harness=obj(name=STR, version=STR),
    tasks=mapping(obj(version="any", n_shot=(INT, "null"))),
    data=arr("dict"),
    limit=(INT, "null"),
    seed=(INT, "null"),
    text=OPT_STR,
    checkpoints=arr(
        obj(
            name=STR,
            kind=STR,
            targeted_sparsity=NUM,
            params=INT,
            nonzero_params=INT,
            metrics=mapping(mapping("any")),
            samples=mapping(INT),
            requests=INT,
            seconds=NUM,
            perplexity=OPT_NUM,
            memory=arr("dict"),
            items=mapping(arr("dict")),
            logged=mapping(STR),
            comparison=nullable(
                obj(
                    tasks=mapping(mapping(INTERVAL)),
                    mean=nullable(obj(metric=STR, **INTERVAL)),
                    perplexity=nullable(INTERVAL),
                )
            ),
        )
    ),
    comparison=obj(mean=STR, **_METHOD),
    warnings=arr(STR),
)
