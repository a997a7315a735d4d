"""Benchmark what unstructured sparsity buys on this machine: `sparsetool bench` on the two
matrix shapes of a 7B Llama (4096 x 4096 attention, 11008 x 4096 feed-forward) at 50-95%
sparsity and batch 1-2048, and, given `--fit`, `simulate`'s CPU model set against it before and
after fitting its constants.

Prints the Markdown for benchmarks/RESULTS.md: per shape, the break-even sparsity of the fastest
sparse kernel and its best speed-up at each batch; every figure is a ratio of two medians timed
in the same run (dense and sparse alternate per point), so a busy machine moves both.

    python benchmarks/bench_kernels.py --out /tmp/kernels          # the measurement (~20 min)
    python benchmarks/bench_kernels.py --out /tmp/kernels --fit    # then simulate against it
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

SHAPES = ("4096x4096", "11008x4096")
SPARSITIES = "0.5,0.6,0.7,0.8,0.9,0.95"
BATCHES = "1,8,64,512,2048"


def measure(shape: str, out: Path, repeats: int, threads: int) -> dict:
    path = out / f"bench-{shape}.json"
    if not path.exists():
        cmd = [
            sys.executable,
            "-m",
            "sparsetool",
            "bench",
            "--shape",
            shape,
            "--sparsity",
            SPARSITIES,
            "--batch",
            BATCHES,
            "--repeats",
            str(repeats),
            "--threads",
            str(threads),
            "--json",
            "-q",
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr}")
        path.write_text(done.stdout)
    return json.loads(path.read_text())


def table(res: dict) -> list[str]:
    batches = res["batches"]
    lines = [
        "| sparsity | " + " | ".join(f"batch {b}" for b in batches) + " |",
        "|---|" + "---|" * len(batches),
    ]
    for ly in sorted(res["layers"], key=lambda ly: ly["sparsity"]):
        cells = [f"{r['best_speedup']:.2f}x {r['best']}" for r in ly["runs"]]
        lines.append(f"| {ly['sparsity']:.2f} | " + " | ".join(cells) + " |")
    be = {r["batch"]: r for r in res["break_even"] if r["kernel"] == "best"}
    cells = []
    for b in batches:
        r = be[b]
        cells.append(
            f"{r['sparsity']:.1%}"
            if r["status"] == "crossed"
            else "below 50%"
            if r["status"] == "always"
            else "above 95%"
        )
    lines.append("| **break-even** | " + " | ".join(cells) + " |")
    dense = {r["batch"]: r["dense"] for r in res["layers"][0]["runs"]}
    lines.append(
        "| dense time | "
        + " | ".join(f"{dense[b]['median_s'] * 1e3:.3g} ms" for b in batches)
        + " |"
    )
    return lines


def fit(out: Path) -> None:
    for shape in SHAPES:
        path = out / f"bench-{shape}.json"
        cmd = [
            sys.executable,
            "-m",
            "sparsetool",
            "simulate",
            "--measured",
            str(path),
            "--fit",
            "--json",
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr}")
        (out / f"fit-{shape}.json").write_text(done.stdout)
        print(f"### simulate --measured {path.name} --fit\n")
        print(done.stdout[:4000])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for the JSON of each run")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--threads", type=int, default=2, help="torch's threads, and scipy-csr-rows' bands"
    )
    ap.add_argument("--fit", action="store_true", help="also run simulate --measured --fit")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for shape in SHAPES:
        res = measure(shape, args.out, args.repeats, args.threads)
        d = res["device"]
        print(
            f"### {shape}, {d['name']}, threads {d['threads']}, torch {d['torch']}, "
            f"SciPy {d['scipy']}, {res['dtype']}\n"
        )
        print("\n".join(table(res)) + "\n")
        print(f"verdict: {res['verdict']}\n")
    if args.fit:
        fit(args.out)


if __name__ == "__main__":
    main()
