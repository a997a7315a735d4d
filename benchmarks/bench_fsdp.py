"""Benchmark `train --distributed fsdp` against `--distributed ddp`: peak memory per process and
time per optimizer step, two processes on this machine (gloo, one thread each), for a
0.43B-parameter built-in GPT (22 layers, width 1280, 20 heads, context 128) trained with static
50% sparsity (so the masks are part of it), one sequence per process per step.

Peak memory is the largest peak RSS of the processes (``measure.run_measured`` on torchrun: as
``/usr/bin/time -f %M``, the largest of torchrun and its children); the step time is the median
over the steps after the first (the log's tokens/s). Both runs save their checkpoint at the end,
which is part of what is measured. The memory plan each run prints (and refuses by) is reported
beside the measurement.

Prints the Markdown for benchmarks/RESULTS.md (~6 min, ~20 GB of RAM at the DDP run's peak):

    python benchmarks/bench_fsdp.py --out /tmp/fsdp
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
from pathlib import Path

from measure import run_measured

MODEL = [
    "--preset",
    "base",
    "--n-layer",
    "22",
    "--d-model",
    "1280",
    "--n-head",
    "20",
    "--context",
    "128",
]
RUN = [
    "--steps",
    "5",
    "--warmup",
    "1",
    "--batch-size",
    "1",
    "--algorithm",
    "static",
    "--sparsity",
    "0.5",
    "--eval-every",
    "0",
    "--threads",
    "1",
]


def measure(strategy: str, out: Path, world: int) -> dict:
    run_dir = out / strategy
    shutil.rmtree(run_dir, ignore_errors=True)
    config = out / "eval.yaml"
    config.write_text("eval_sequences: 2\n")  # the final validation: two sequences, not 64
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(world),
        "-m",
        "sparsetool",
        "train",
        "-o",
        str(run_dir),
        "--config",
        str(config),
        "--distributed",
        strategy,
        *MODEL,
        *RUN,
    ]
    done = run_measured(cmd, env=env)
    if not done.ok:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    plan = next((line for line in done.stdout.splitlines() if line.startswith("memory plan")), "")
    steps = [json.loads(x) for x in (run_dir / "log.jsonl").read_text().splitlines()]
    train = [r for r in steps if r["kind"] == "train"]
    tokens = world * 128  # per step: one sequence per process
    times = [tokens / r["tokens_per_s"] for r in train[1:]]
    summary = {
        "strategy": strategy,
        "peak_rss_mib": done.peak_rss_mib,
        "step_s": statistics.median(times),
        "plan": plan,
        "loss": train[-1]["loss"],
        "params": None,
    }
    start = done.stdout.splitlines()[0] if done.stdout else ""
    found = re.search(r"([\d,]+) parameters", start)
    summary["params"] = int(found.group(1).replace(",", "")) if found else None
    shutil.rmtree(run_dir, ignore_errors=True)  # ~8 GB of checkpoint
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--world", type=int, default=2)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ddp = measure("ddp", args.out, args.world)
    fsdp = measure("fsdp", args.out, args.world)
    print(f"model: {ddp['params']:,} parameters; {args.world} processes, one thread each\n")
    print("| | peak RSS per process | step time | final loss |")
    print("|---|---|---|---|")
    for r in (ddp, fsdp):
        print(
            f"| {r['strategy']} | {r['peak_rss_mib'] / 1024:.2f} GiB | {r['step_s']:.2f} s | "
            f"{r['loss']:.4f} |"
        )
    print(
        f"| fsdp / ddp | {fsdp['peak_rss_mib'] / ddp['peak_rss_mib']:.2f}x | "
        f"{fsdp['step_s'] / ddp['step_s']:.2f}x | |\n"
    )
    for r in (ddp, fsdp):
        print(f"- {r['strategy']}: {r['plan']}")


if __name__ == "__main__":
    main()
