"""Start-up time of `sparsetool flops`, against bare Python and an `import torch` in the same run.

The flops command is arithmetic only; its cost should be interpreter start + typer/rich, never
torch. Each command runs as a fresh process; we report the median and minimum wall time.

    python benchmarks/bench_flops_startup.py [--repeat 10]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

from measure import machine, run_measured


def wall(cmd: list[str], repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        m = run_measured(cmd, keep_output=False)
        if not m.ok:
            raise SystemExit(f"{' '.join(cmd)} failed ({m.returncode})")
        times.append(m.wall_s)
    return statistics.median(times), min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    py = sys.executable
    exe = shutil.which("sparsetool", path=os.path.dirname(py)) or shutil.which("sparsetool")
    flops_args = ["flops", "--model", "gpt3-xl", "--sparsity", "0.75"]
    cases = [
        ("python -c pass (baseline)", [py, "-c", "pass"]),
        ("python -c 'import sparsetool.flops'", [py, "-c", "import sparsetool.flops"]),
        ("python -c 'import typer, rich.table'", [py, "-c", "import typer, rich.table"]),
        ("sparsetool --help", [exe, "--help"]),
        ("sparsetool flops --model gpt3-xl --sparsity 0.75", [exe, *flops_args]),
        ("sparsetool flops ... --json", [exe, *flops_args, "--json"]),
        (
            "sparsetool flops --model gpt2-small -s 0,0.5,0.75 --breakdown",
            [exe, "flops", "--model", "gpt2-small", "-s", "0,0.5,0.75", "--breakdown"],
        ),
        ("python -c 'import torch' (what flops avoids)", [py, "-c", "import torch"]),
    ]
    # Does the command load torch or numpy? Run it in-process and look at sys.modules.
    probe = (
        "import sys; from sparsetool.cli.main import app\n"
        f"try:\n    app({flops_args!r})\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    )
    loaded = subprocess.run([py, "-c", probe], capture_output=True, text=True, check=True)
    heavy = loaded.stdout.strip().splitlines()[-1]

    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"machine: {machine()} ({len(os.sched_getaffinity(0))} usable)")
    print(f"python: {platform.python_version()}; repeat {args.repeat}")
    print(f"command: python benchmarks/bench_flops_startup.py --repeat {args.repeat}")
    print(f"heavy modules loaded by `sparsetool flops`: {heavy}")
    base = None
    print("\n| command | median s | min s | median / baseline |")
    print("|---|---:|---:|---:|")
    for label, cmd in cases:
        med, mn = wall(cmd, args.repeat)
        base = base or med
        print(f"| `{label}` | {med:.3f} | {mn:.3f} | {med / base:.1f}x |")


if __name__ == "__main__":
    main()
