"""The seeds' training claims at CPU scale, several seeds each: writes benchmarks/REPLICATION.md.

    python benchmarks/bench_replication.py [--seeds 0,1,2] [--jobs 2] [--steps 600]
    python benchmarks/bench_replication.py --report     # rewrite REPLICATION.md from saved runs

Every run is a real ``sparsetool train`` process (``--threads 1``; ``--jobs`` of them at once) on
the built-in corpora with the command's own defaults for everything the table does not name: the
mask-update interval, start, stop and drop fraction are not tuned per method. Pre-training: dense,
static, SET, RigL and GraNet at 75% (GraNet ramps 50% -> 75%, as the Cerebras sparsity-library
post's GraNet run ramps 50% -> 80%), and Variable SPDF (90% for 5/6 of the steps, then dense:
75% on average). Fine-tuning on ``builtin:english`` (English prose the pre-training corpus
excludes): dense from dense (the baseline), dense from static 75% (SPDF), sparse from static 75%,
and dense from Variable SPDF. A claim "replicates" when it holds for the mean over seeds and in
every seed; "mixed" when the mean agrees but some seed does not; otherwise "does not replicate".
Runs already finished (their summary.json exists) are not run again. \
Work: benchmarks/work/replication/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent
WORK = ROOT / "work" / "replication"
OUT = ROOT / "REPLICATION.md"

PRETRAIN = {  # name -> train options (beyond the common ones)
    "dense": [],
    "static": ["--algorithm", "static", "--sparsity", "0.75"],
    "set": ["--algorithm", "set", "--sparsity", "0.75"],
    "rigl": ["--algorithm", "rigl", "--sparsity", "0.75"],
    "granet": ["--algorithm", "granet", "--sparsity", "0.75", "--initial-sparsity", "0.5"],
    "vspdf": ["--stage", "0.9:0.8333333333333334", "--stage", "0:0.16666666666666666"],
}
FINETUNE = {  # name -> (pre-training run, train options)
    "ft-dense-from-dense": ("dense", []),
    "ft-dense-from-static (SPDF)": ("static", ["--dense"]),
    "ft-sparse-from-static": ("static", []),
    "ft-dense-from-vspdf (Variable SPDF)": ("vspdf", ["--dense"]),
}
LABELS = {
    "dense": "dense",
    "static": "static 75%",
    "set": "SET 75%",
    "rigl": "RigL 75%",
    "granet": "GraNet 50% -> 75%",
    "vspdf": "Variable SPDF: 90% for 5/6, then dense",
}


def run_dir(name: str, seed: int) -> Path:
    return WORK / f"{name.split(' ')[0]}-seed{seed}"


def train(name: str, seed: int, argv: list[str], args: argparse.Namespace, log) -> dict:
    out = run_dir(name, seed)
    done = out / "summary.json"
    if done.exists():
        return json.loads(done.read_text())
    if out.exists():
        import shutil

        shutil.rmtree(out)
    cmd = [
        sys.executable,
        "-m",
        "sparsetool",
        "train",
        "-o",
        str(out),
        "--threads",
        "1",
        "--json",
        "--seed",
        str(seed),
        *argv,
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(
            f"{name} seed {seed} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}"
        )
    summary = json.loads(proc.stdout)
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    summary["command"] = " ".join(cmd[2:])
    done.write_text(json.dumps(summary, indent=2))
    log(
        f"{name:38s} seed {seed}  val {summary['val_loss']:.4f}  sparsity "
        f"{summary['sparsity']:.3f}  {summary['wall_s']:.0f} s"
    )
    return summary


def run_all(args: argparse.Namespace) -> None:
    seeds = [int(s) for s in args.seeds.split(",")]
    common = [
        "--preset",
        args.preset,
        "--steps",
        str(args.steps),
        "--batch-size",
        "16",
        "--lr",
        str(args.lr),
        "--warmup",
        str(args.warmup),
        "--eval-every",
        str(args.steps),
    ]
    ft_common = [
        "--steps",
        str(args.ft_steps),
        "--batch-size",
        "16",
        "--lr",
        str(args.ft_lr),
        "--warmup",
        str(args.ft_warmup),
        "--eval-every",
        str(args.ft_steps),
        "--data",
        "builtin:english",
    ]
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "settings.json").write_text(json.dumps(vars(args), indent=2))
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.0f} s] {msg}", flush=True)

    with ThreadPoolExecutor(args.jobs) as pool:  # each job is its own process
        pre = [
            pool.submit(train, n, s, common + o, args, log)
            for s in seeds
            for n, o in PRETRAIN.items()
        ]
        for f in pre:
            f.result()
        fts = [
            pool.submit(
                train,
                n,
                s,
                ft_common + ["--init", str(run_dir(p, s) / "model.safetensors")] + o,
                args,
                log,
            )
            for s in seeds
            for n, (p, o) in FINETUNE.items()
        ]
        for f in fts:
            f.result()
    (WORK / "settings.json").write_text(
        json.dumps({**vars(args), "wall_s": round(time.perf_counter() - t0)}, indent=2)
    )
    write_report()


def _results() -> tuple[dict, dict[str, dict[int, dict]]]:
    settings = json.loads((WORK / "settings.json").read_text())
    seeds = [int(s) for s in settings["seeds"].split(",")]
    res: dict[str, dict[int, dict]] = {}
    for name in [*PRETRAIN, *FINETUNE]:
        for s in seeds:
            p = run_dir(name, s) / "summary.json"
            if p.exists():
                res.setdefault(name, {})[s] = json.loads(p.read_text())
    return settings, res


def _stats(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4f} | - | {values[0]:.4f} - {values[0]:.4f}"
    return (
        f"{statistics.fmean(values):.4f} | {statistics.stdev(values):.4f} | {min(values):.4f} "
        f"- {max(values):.4f}"
    )


def _rows(res: dict, labels: dict[str, str]) -> list[str]:
    """One table row per run name: seeds, mean final sparsity, validation loss statistics."""
    rows = []
    for name, label in labels.items():
        runs = res.get(name, {})
        if runs:
            vals = [r["val_loss"] for r in runs.values()]
            sp = statistics.fmean(r["sparsity"] for r in runs.values())
            rows.append(f"| {label} | {len(runs)} | {sp:.3f} | {_stats(vals)} |")
    return rows


def _claim(res: dict, better: str, worse: str) -> tuple[str, str]:
    """Is ``better``'s validation loss lower than ``worse``'s? (verdict, figures)"""
    seeds = sorted(set(res.get(better, {})) & set(res.get(worse, {})))
    if not seeds:
        return "not run", "-"
    diffs = [res[better][s]["val_loss"] - res[worse][s]["val_loss"] for s in seeds]
    mean = statistics.fmean(diffs)
    spread = ""
    if len(seeds) > 1:
        sd = [statistics.stdev([res[n][s]["val_loss"] for s in seeds]) for n in (better, worse)]
        spread = f"; seed-to-seed std {sd[0]:.4f} / {sd[1]:.4f}"
    if mean < 0 and all(d < 0 for d in diffs):
        verdict = "replicates"
    elif mean < 0:
        verdict = "mixed"
    else:
        verdict = "does not replicate"
    per_seed = ", ".join(f"{d:+.4f}" for d in diffs)
    return verdict, f"mean {mean:+.4f} (per seed {per_seed}{spread})"


CLAIMS = [  # (claim, source, better run, worse run)
    (
        "Dense pre-training ends lower than 75% static sparse pre-training at equal tokens (the "
        "cost SPDF then recovers)",
        "SPDF paper, Table 1",
        "dense",
        "static",
    ),
    (
        "Dynamic sparsity beats static sparsity at the same sparsity: RigL",
        "Cerebras sparsity-library post, Table 3; RigL paper",
        "rigl",
        "static",
    ),
    (
        "Dynamic sparsity beats static sparsity at the same sparsity: SET",
        "Cerebras sparsity-library post, Table 3; SET paper",
        "set",
        "static",
    ),
    (
        "RigL's gradient-based growth beats SET's random growth",
        "RigL paper (Evci et al. 2020)",
        "rigl",
        "set",
    ),
    (
        "GraNet's gradual ramp beats RigL at the final sparsity",
        "Cerebras sparsity-library post, Figure 8 (GraNet 50% -> 80% vs 80%)",
        "granet",
        "rigl",
    ),
    (
        "Sparse pre-training then dense fine-tuning (SPDF) beats sparse fine-tuning",
        "SPDF paper, section 3.2, Figure 2",
        "ft-dense-from-static (SPDF)",
        "ft-sparse-from-static",
    ),
    (
        "Variable SPDF beats SPDF at the same average sparsity, after dense fine-tuning",
        "Variable SPDF post, Tables 1-2",
        "ft-dense-from-vspdf (Variable SPDF)",
        "ft-dense-from-static (SPDF)",
    ),
    (
        "Variable SPDF pre-training ends lower than static 75% pre-training (same average "
        "sparsity)",
        "Variable SPDF post",
        "vspdf",
        "static",
    ),
]


def write_report() -> None:
    settings, res = _results()
    seeds = settings["seeds"]
    lines = [
        "# Replication of the seeds' training claims at CPU scale",
        "",
        "Written by `benchmarks/bench_replication.py` from real `sparsetool train` runs; nothing "
        "in this",
        "file is edited by hand. Validation loss is the trainer's mean cross-entropy in nats per "
        "byte on",
        "its fixed validation sequences (lower is better).",
        "",
        f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; machine: {os.cpu_count()} CPUs, "
        f"{platform.machine()}, shared with other jobs; python {platform.python_version()}",
        f"- command: `python benchmarks/bench_replication.py --seeds {seeds} --jobs "
        f"{settings['jobs']} --steps {settings['steps']}` ({settings.get('wall_s', '?')} s wall "
        "in all)",
        f"- pre-training: preset `{settings['preset']}`, {settings['steps']} steps x 16 "
        f"sequences, lr {settings['lr']} (warm-up {settings['warmup']}, cosine to 10%), the "
        "built-in corpus (Python's own source); every other setting is `sparsetool train`'s "
        f"default (uniform distribution, random initial masks; {_resolved(settings)})",
        f"- fine-tuning: {settings['ft_steps']} steps, lr {settings['ft_lr']} (warm-up "
        f"{settings['ft_warmup']}) on `builtin:english`; `--dense` revives pruned weights at 0",
        f"- seeds: {seeds} (each changes initial weights, masks and data order)",
        "",
        "## Pre-training",
        "",
        "| run | seeds | final sparsity | val loss, mean | std | min - max |",
        "|---|---:|---:|---:|---:|---|",
    ]
    lines += _rows(res, {n: LABELS[n] for n in PRETRAIN})
    lines += [
        "",
        "## Fine-tuning on English text",
        "",
        "| run | seeds | sparsity while fine-tuning | val loss, mean | std | min - max |",
        "|---|---:|---:|---:|---:|---|",
    ]
    lines += _rows(res, {n: n for n in FINETUNE})
    lines += [
        "",
        "## Claims",
        "",
        "Difference = first run's val loss minus the second's (negative: the claim's direction).",
        "",
        "| claim | source | runs compared | verdict | difference |",
        "|---|---|---|---|---|",
    ]
    for text, source, better, worse in CLAIMS:
        verdict, figures = _claim(res, better, worse)
        lines.append(
            f"| {text} | {source} | {better.split(' ')[0]} vs {worse.split(' ')[0]} | "
            f"**{verdict}** | {figures} |"
        )
    lines += [
        "",
        "Scale: the seeds' claims come from 111M-6.7B-parameter models trained on billions of",
        f"tokens; these runs train a {_params(res)} model on "
        f"{int(settings['steps']) * 16 * 128:,} bytes. A claim that does not replicate here says",
        "nothing about it at scale, only that it does not carry down to this budget.",
        "",
    ]
    OUT.write_text("\n".join(lines))
    print("\n".join(lines))


def _resolved(settings: dict) -> str:
    """The mask-update settings the RigL run resolved from the defaults (its run.json)."""
    seed = settings["seeds"].split(",")[0]
    try:
        run = json.loads((WORK / f"rigl-seed{seed}" / "run.json").read_text())
        st = run["sparse_training"]
        st = next(iter(st.values())) if isinstance(st, dict) and "algorithm" not in st else st
        keys = ("update_freq", "update_start", "update_stop", "drop_fraction", "drop_decay")
        return "RigL resolved " + ", ".join(f"{k} {st[k]}" for k in keys if k in st)
    except (OSError, KeyError, TypeError, IndexError, ValueError):
        return "see each run's run.json for the resolved mask-update settings"


def _params(res: dict) -> str:
    for runs in res.values():
        for r in runs.values():
            if r.get("params"):
                return f"{r['params']:,}-parameter"
    return "small"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument(
        "--jobs", type=int, default=2, help="training processes at once (one thread each)"
    )
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--ft-steps", type=int, default=200)
    ap.add_argument("--ft-lr", type=float, default=5e-4)
    ap.add_argument("--ft-warmup", type=int, default=20)
    ap.add_argument(
        "--report", action="store_true", help="only rewrite REPLICATION.md from saved runs"
    )
    args = ap.parse_args()
    if args.report:
        write_report()
    else:
        run_all(args)


if __name__ == "__main__":
    main()
