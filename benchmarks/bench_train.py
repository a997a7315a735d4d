"""Benchmarks of `sparsetool train` (a script, not a test).

  python benchmarks/bench_train.py overhead    # (a) step time of each algorithm vs dense
  python benchmarks/bench_train.py replicate   # (b) small-scale replication of the seeds' claims
  python benchmarks/bench_train.py report      # print the markdown tables from saved results

(a) Same model, data and batch for every algorithm; the runs are interleaved (dense, static, ...,
dense, static, ...) so machine-load drift hits all alike. Per-step time comes from the loop's own
timer (micro-batches, clipping, sparsifier hooks, AdamW). Static: median step. Dynamic algorithms:
mean over all steps, i.e. amortised over their mask updates at the update frequency used.

(b) Pre-training on the built-in corpus (Python standard library source) for the same number of
tokens: dense, static 75% (random masks, as SPDF), RigL 75%, GraNet 50% -> 75%, and Variable SPDF
(90% static for 5/6 of the steps, then dense: 75% sparsity on average). Then fine-tuning
on a second corpus (the English help topics of ``pydoc_data``, which the built-in corpus
excludes): dense pre-train + dense fine-tune (baseline), static-75% pre-train + dense fine-tune
(SPDF, revived weights at 0), static-75% pre-train + sparse fine-tune (the paper's sparse-to-sparse
comparison), Variable SPDF pre-train + dense fine-tune. Validation loss = mean cross-entropy \
in nats/byte on a fixed validation set.

Everything runs with one CPU thread (on a shared 2-core machine, more threads were ~10x slower
for these model sizes). Results go to benchmarks/work/train/ (git-ignored).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
WORK = ROOT / "work" / "train"

ALGOS = {
    "dense": {},
    "static": {"algorithm": "static", "sparsity": 0.75},
    "gmp": {"algorithm": "gmp", "sparsity": 0.75},
    "set": {"algorithm": "set", "sparsity": 0.75},
    "rigl": {"algorithm": "rigl", "sparsity": 0.75},
    "granet": {"algorithm": "granet", "sparsity": 0.75, "initial_sparsity": 0.5},
    "imp": {"algorithm": "imp", "sparsity": 0.75, "sparsity_options": {"fraction": 0.5}},
}


def _train(name: str, time_hooks: bool = False, **options) -> dict:
    from sparsetool.train.configkeys import merge
    from sparsetool.train.loop import Trainer

    out = WORK / name
    if out.exists():
        import shutil

        shutil.rmtree(out)
    steps: list[dict] = []
    cfg = merge({}, {"out": str(out), "threads": 1, **options})

    def cb(kind: str, info: dict) -> None:
        if kind == "step":
            steps.append(info)

    t0 = time.perf_counter()
    trainer = Trainer(cfg, callback=cb)
    hook_s = _time_sparsifier_hooks(trainer) if time_hooks else None
    summary = trainer.run()
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    if hook_s is not None:
        summary["hook_s_per_step"] = [hook_s.get(i + 1, 0.0) for i in range(len(steps))]
    per_step = steps[0]["tokens"] if steps else 0
    summary["step_times"] = [per_step / r["tokens_per_s"] for r in steps]
    return summary


def _time_sparsifier_hooks(trainer) -> dict[int, float]:
    """Seconds spent per step in the work sparsity adds (before_step, after_step, lr_step and the
    sparsity read-out for the log), measured inside the same run as the step itself so that
    machine-load drift cancels out of the ratio."""
    spent: dict[int, float] = {}
    current = {"step": 0}
    build = trainer._build_sparsifier

    def timed(fn, first: bool = False):
        def wrapper(*a, **k):
            if first:
                current["step"] += 1
            t = time.perf_counter()
            out = fn(*a, **k)
            spent[current["step"]] = spent.get(current["step"], 0.0) + time.perf_counter() - t
            return out

        return wrapper

    def build_timed(*a, **k):
        sp = build(*a, **k)
        if sp is not None:
            sp.before_step = timed(sp.before_step, first=True)
            sp.after_step = timed(sp.after_step)
            sp.lr_step = timed(sp.lr_step)
            sp.sparsity = timed(sp.sparsity)
        return sp

    trainer._build_sparsifier = build_timed
    return spent


def overhead(args: argparse.Namespace) -> None:
    common = dict(
        preset=args.preset,
        steps=args.steps,
        batch_size=args.batch_size,
        warmup=5,
        eval_every=0,
        eval_sequences=8,
        update_freq=args.update_freq,
        update_start=args.update_freq,
        update_stop=args.steps - 1,
    )
    times: dict[str, list[float]] = {a: [] for a in ALGOS}
    hooks: dict[str, list[float]] = {a: [] for a in ALGOS}
    for rep in range(args.reps):
        for algo, opts in ALGOS.items():
            o = dict(common)
            if algo in ("dense", "static"):
                for k in ("update_freq", "update_start", "update_stop"):
                    o.pop(k)
            if algo == "imp":
                for k in ("update_start", "update_stop"):
                    o.pop(k)
            s = _train(f"overhead-{algo}-{rep}", time_hooks=True, **o, **opts)
            times[algo].extend(s["step_times"][args.skip :])
            hooks[algo].extend(s["hook_s_per_step"][args.skip :])
            print(
                f"rep {rep} {algo:7s} median "
                f"{statistics.median(s['step_times'][args.skip :]) * 1e3:7.1f} ms  mean "
                f"{statistics.fmean(s['step_times'][args.skip :]) * 1e3:7.1f} ms",
                flush=True,
            )
    res = {"args": vars(args), "algos": {}}
    base_med = statistics.median(times["dense"])
    base_mean = statistics.fmean(times["dense"])
    for algo, ts in times.items():
        res["algos"][algo] = {
            "median_ms": statistics.median(ts) * 1e3,
            "mean_ms": statistics.fmean(ts) * 1e3,
            "median_ratio": statistics.median(ts) / base_med,
            "mean_ratio": statistics.fmean(ts) / base_mean,
            "n": len(ts),
            # the sparsity work as a fraction of the dense part of the same steps
            "hook_fraction_median": statistics.median(
                h / max(t - h, 1e-9) for h, t in zip(hooks[algo], ts)
            ),
            "hook_fraction_amortised": sum(hooks[algo]) / max(sum(ts) - sum(hooks[algo]), 1e-9),
        }
    _save("overhead", res)
    _print_overhead(res)


def _print_overhead(res: dict) -> None:
    a = res["args"]
    print(
        f"\npreset {a['preset']}, batch {a['batch_size']}, {a['steps']} steps x {a['reps']} reps "
        f"(first {a['skip']} dropped), mask updates every {a['update_freq']} steps\n"
    )
    print(
        "| algorithm | median step (ms) | mean step (ms) | median / dense | mean / dense "
        "(amortised) | sparsity work / rest of step, median | same, amortised |"
    )
    print("|---|---|---|---|---|---|---|")
    for algo, r in res["algos"].items():
        print(
            f"| {algo} | {r['median_ms']:.1f} | {r['mean_ms']:.1f} | {r['median_ratio']:.3f} | "
            f"{r['mean_ratio']:.3f} | {r['hook_fraction_median']:.1%} | "
            f"{r['hook_fraction_amortised']:.1%} |"
        )


def _finetune_corpus() -> Path:
    from pydoc_data.topics import topics

    path = WORK / "pydoc_topics.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(topics[k] for k in sorted(topics)))
    return path


def replicate(args: argparse.Namespace) -> None:
    pre = dict(
        preset=args.preset,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup=args.warmup,
        eval_every=args.eval_every,
        eval_sequences=args.eval_sequences,
        seed=args.seed,
    )
    runs = {
        "pre-dense": {},
        "pre-static75": {"algorithm": "static", "sparsity": 0.75},
        "pre-rigl75": {"algorithm": "rigl", "sparsity": 0.75, "update_freq": 50},
        # fewer, later-starting updates (the Cerebras post lowers the update frequency for RigL)
        "pre-rigl75-freq150": {"algorithm": "rigl", "sparsity": 0.75, "update_freq": 150},
        "pre-granet50-75": {
            "algorithm": "granet",
            "sparsity": 0.75,
            "initial_sparsity": 0.5,
            "update_freq": 50,
        },
        # Variable SPDF: 90% static sparsity for 5/6 of the steps, then dense: the same 75%
        # average sparsity (0.9 * 5/6) as pre-static75
        "pre-vspdf90-then-dense": {"stages": [(0.9, 5 / 6), (0.0, 1 / 6)]},
    }
    results = _load("replicate") or {"pretrain": {}, "finetune": {}}
    results["args"] = vars(args)
    only = set(args.only.split(",")) if args.only else None
    for name, opts in runs.items():
        if only and name not in only:
            continue
        if args.seed:
            name = f"{name}-seed{args.seed}"  # extra seeds measure run-to-run noise
        s = _train(name, **pre, **opts)
        s.pop("step_times")
        results["pretrain"][name] = s
        print(
            f"{name:18s} val {s['val_loss']:.4f} train {s['loss']:.4f} sparsity "
            f"{s['sparsity']:.3f} wall {s['wall_s']:.0f}s",
            flush=True,
        )
        _save("replicate", results)
    if args.seed:
        _print_replicate(results)
        return  # fine-tuning starts from the seed-0 pre-trained models only
    data = str(_finetune_corpus())
    ft = dict(
        preset=args.preset,
        steps=args.ft_steps,
        batch_size=args.batch_size,
        lr=args.ft_lr,
        warmup=args.ft_warmup,
        eval_every=args.ft_eval_every,
        eval_sequences=args.eval_sequences,
        seed=args.seed,
        data=data,
    )
    fts = {
        "ft-dense-from-dense": {"init": str(WORK / "pre-dense" / "model.safetensors")},
        "ft-dense-from-static75 (SPDF)": {
            "init": str(WORK / "pre-static75" / "model.safetensors"),
            "dense": True,
        },
        "ft-sparse-from-static75": {"init": str(WORK / "pre-static75" / "model.safetensors")},
        "ft-dense-from-vspdf (Variable SPDF)": {
            "init": str(WORK / "pre-vspdf90-then-dense" / "model.safetensors")
        },
    }
    for name, opts in fts.items():
        if only and name.split(" ")[0] not in only:
            continue
        s = _train(name.split(" ")[0], **ft, **opts)
        s.pop("step_times")
        # zero-shot: the pre-trained model on the fine-tuning validation set before any update
        s["zero_shot_val_loss"] = _zero_shot(opts["init"], data, args)
        results["finetune"][name] = s
        print(
            f"{name:30s} val {s['val_loss']:.4f} (zero-shot {s['zero_shot_val_loss']:.4f}) "
            f"sparsity {s['sparsity']:.3f} wall {s['wall_s']:.0f}s",
            flush=True,
        )
        _save("replicate", results)
    _print_replicate(results)


def _zero_shot(init: str, data: str, args: argparse.Namespace) -> float:
    from sparsetool.train.configkeys import merge
    from sparsetool.train.loop import Trainer

    out = WORK / "zero-shot-tmp"
    if out.exists():
        import shutil

        shutil.rmtree(out)
    cfg = merge(
        {},
        {
            "out": str(out),
            "init": init,
            "data": data,
            "preset": args.preset,
            "steps": 1,
            "eval_sequences": args.eval_sequences,
            "batch_size": args.batch_size,
            "threads": 1,
        },
    )
    return Trainer(cfg).evaluate()


def _print_replicate(res: dict) -> None:
    a = res.get("args", {})
    print(
        f"\npre-training: preset {a.get('preset')}, {a.get('steps')} steps x batch "
        f"{a.get('batch_size')}, lr {a.get('lr')}; fine-tuning: {a.get('ft_steps')} steps, lr "
        f"{a.get('ft_lr')}\n"
    )
    pre = res["pretrain"]
    base = pre.get("pre-dense", {}).get("val_loss")
    print(
        "| pre-training run | final sparsity | validation loss (nats/byte) | vs dense | train "
        "loss | wall (s) |"
    )
    print("|---|---|---|---|---|---|")
    for name, s in pre.items():
        rel = f"{s['val_loss'] - base:+.4f}" if base else "-"
        print(
            f"| {name} | {s['sparsity']:.3f} | {s['val_loss']:.4f} | {rel} | {s['loss']:.4f} | "
            f"{s['wall_s']:.0f} |"
        )
    ft = res["finetune"]
    if ft:
        base = ft.get("ft-dense-from-dense", {}).get("val_loss")
        print(
            "\n| fine-tuning run (second corpus) | sparsity during fine-tuning | zero-shot val "
            "loss | val loss after fine-tuning | vs dense baseline |"
        )
        print("|---|---|---|---|---|")
        for name, s in ft.items():
            rel = f"{s['val_loss'] - base:+.4f}" if base else "-"
            print(
                f"| {name} | {s['sparsity']:.3f} | {s['zero_shot_val_loss']:.4f} | "
                f"{s['val_loss']:.4f} | {rel} |"
            )


def _save(name: str, obj: dict) -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / f"{name}.json").write_text(json.dumps(obj, indent=2))


def _load(name: str) -> dict | None:
    p = WORK / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None


def main() -> None:
    torch.set_num_threads(1)
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="what", required=True)
    o = sub.add_parser("overhead")
    o.add_argument("--preset", default="mini")
    o.add_argument("--steps", type=int, default=60)
    o.add_argument("--batch-size", type=int, default=16)
    o.add_argument("--reps", type=int, default=3)
    o.add_argument("--skip", type=int, default=5)
    o.add_argument("--update-freq", type=int, default=20)
    r = sub.add_parser("replicate")
    r.add_argument("--preset", default="mini")
    r.add_argument("--steps", type=int, default=600)
    r.add_argument("--batch-size", type=int, default=16)
    r.add_argument("--lr", type=float, default=2e-3)
    r.add_argument("--warmup", type=int, default=50)
    r.add_argument("--eval-every", type=int, default=100)
    r.add_argument("--eval-sequences", type=int, default=128)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--ft-steps", type=int, default=200)
    r.add_argument("--ft-lr", type=float, default=5e-4)
    r.add_argument("--ft-warmup", type=int, default=20)
    r.add_argument("--ft-eval-every", type=int, default=50)
    r.add_argument("--only", default="", help="comma-separated run names to (re)run")
    sub.add_parser("report")
    args = ap.parse_args()
    if args.what == "overhead":
        overhead(args)
    elif args.what == "replicate":
        replicate(args)
    else:
        for name, printer in (("overhead", _print_overhead), ("replicate", _print_replicate)):
            res = _load(name)
            if res:
                printer(res)


if __name__ == "__main__":
    sys.exit(main())
