"""Calibration pruning against magnitude and random on a small trained GPT (a script, not a test).

  python benchmarks/bench_calibration.py [--run DIR] [--steps 400] [--samples 128] [--seq 64]
                                         [--eval-tokens 100000]

Model: sparsetool's GPT (GPT-2-shaped: pre-LayerNorm blocks, fused qkv, 4x MLP), 4 layers, width 64,
4 heads, context 64, bytes as tokens, trained by ``sparsetool train`` on the built-in corpus (the
Python standard library) unless ``--run`` names an existing run. It is pruned at 50%, 60% and 2:4
with ``--method`` random, magnitude, wanda and sparsegpt (random takes no ``--nm``). Calibration
text: the first MB of the corpus' training split; held-out perplexity: ``sparsetool eval``'s
library on the first ``--eval-tokens`` bytes of the validation split (files the model never saw).
Each prune runs in its own process; its seconds (the prune call only, torch already imported) and
peak RSS (the whole process, Python and torch included) are printed. Work files go to
benchmarks/work/calibration/ (git-ignored).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
from measure import run_measured

WORK = Path(__file__).resolve().parent / "work" / "calibration"
METHODS = ("random", "magnitude", "wanda", "sparsegpt")
CONFIGS = (("50%", {"sparsity": 0.5}), ("60%", {"sparsity": 0.6}), ("2:4", {"nm": "2:4"}))

CHILD = """
import json, sys, time
import sparsetool
# torch and the library loaded before the clock starts
import sparsetool.ops.prune.calibrated, sparsetool.ops.prune
kw = json.loads(sys.argv[1])
t0 = time.perf_counter()
sparsetool.prune(**kw)
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds}))
"""


def train(run: Path, steps: int) -> None:
    cmd = [
        sys.executable,
        "-m",
        "sparsetool",
        "train",
        "--out",
        str(run),
        "--preset",
        "tiny",
        "--n-layer",
        "4",
        "--d-model",
        "64",
        "--n-head",
        "4",
        "--steps",
        str(steps),
        "--eval-every",
        str(steps),
        "--seed",
        "0",
        "--json",
    ]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def calibration_text(path: Path, size: int = 1 << 20) -> None:
    from sparsetool.util.corpus import load_corpus

    corpus = load_corpus(None)
    path.write_text(corpus.train[:size].tobytes().decode("utf-8", errors="replace"))


def prune(
    run: Path, out: Path, method: str, config: dict, calib: Path, samples: int, seq: int
) -> dict:
    kw = {"checkpoint": str(run), "output": str(out), "method": method, **config}
    if method in ("wanda", "sparsegpt"):
        kw |= {"calibration": str(calib), "samples": samples, "seq": seq}
    r = run_measured([sys.executable, "-c", CHILD, json.dumps(kw)])
    if not r.ok:
        raise SystemExit(f"prune {kw} failed:\n{r.stderr[-2000:]}")
    # the prune's own seconds (the child times it after its imports), its process's peak RSS
    return {**json.loads(r.stdout.strip().splitlines()[-1]), "peak_rss_mib": r.peak_rss_mib}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, default=WORK / "run")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--eval-tokens", type=int, default=100_000)
    args = ap.parse_args()
    from sparsetool.ops.eval import evaluate

    WORK.mkdir(parents=True, exist_ok=True)
    if not (args.run / "model.safetensors").is_file():
        t0 = time.perf_counter()
        train(args.run, args.steps)
        print(f"trained {args.run} in {time.perf_counter() - t0:.0f} s")
    calib = WORK / "calib.txt"
    calibration_text(calib)
    rows = []
    for label, config in CONFIGS:
        for method in METHODS:
            if method == "random" and "nm" in config:
                continue
            out = WORK / f"{method}-{label.replace(':', 'of').replace('%', '')}"
            stats = prune(args.run, out, method, config, calib, args.samples, args.seq)
            rows.append({"config": label, "method": method, "path": out, **stats})
            print(
                f"pruned {label:>4} {method:<9} {stats['seconds']:7.2f} s  "
                f"{stats['peak_rss_mib']:6.0f} MiB",
                flush=True,
            )
    result = evaluate([args.run, *[r["path"] for r in rows]], seq=64, max_tokens=args.eval_tokens)
    dense = result.rows[0]
    print(f"\n{platform.platform()}, {os.cpu_count()} CPUs, torch {torch.__version__}")
    print(
        f"model {args.run}; held-out: {result.text_source[:70]}..., {dense.tokens:,} tokens scored"
    )
    print(f"calibration: {args.samples} x {args.seq} tokens from the training split\n")
    print("| config | method | prune s | peak RSS MiB | perplexity | vs dense |")
    print("|---|---|---:|---:|---:|---:|")
    print(f"| dense | - | - | - | {dense.perplexity:.3f} | - |")
    by_config: dict[str, dict[str, float]] = {}
    for r, ev in zip(rows, result.rows[1:]):
        by_config.setdefault(r["config"], {})[r["method"]] = ev.perplexity
        print(
            f"| {r['config']} | {r['method']} | {r['seconds']:.2f} | {r['peak_rss_mib']:.0f} | "
            f"{ev.perplexity:.3f} | {ev.perplexity / dense.perplexity - 1:+.2%} |"
        )
    print()
    for label, ppl in by_config.items():
        order = " <= ".join(f"{m} {ppl[m]:.3f}" for m in sorted(ppl, key=ppl.get))
        held = ppl["sparsegpt"] <= ppl["wanda"] < ppl["magnitude"] and ppl["magnitude"] < ppl.get(
            "random", float("inf")
        )
        print(
            f"{label}: {order}; sparsegpt <= wanda < magnitude < random: "
            f"{'held' if held else 'did not hold'}"
        )


if __name__ == "__main__":
    main()
