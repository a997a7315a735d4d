"""Start-up cost of the commands that never import torch (`prune` without calibration, `densify`,
`report`, `flops`, `simulate`) on the tiny fixture model, against bare Python and the imports
they cannot do without, each a fresh process; CPU seconds (user + system) and wall seconds.

    python benchmarks/bench_startup.py [--repeat 10]

The second table says which of the heavy modules each command loaded (run in-process, then
``sys.modules`` read): torch never; numpy where the command reads tensors; pydantic always, as
typer 0.29 validates every option through it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from measure import machine, run_measured

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "fixtures" / "tiny-gpt2"
HEAVY = ("torch", "numpy", "pydantic", "rich.console", "typer")


def commands(work: Path) -> list[tuple[str, list[str]]]:
    pruned = work / "pruned"
    return [
        ("report", ["report", str(TINY)]),
        ("prune (magnitude)", ["prune", str(TINY), "-o", str(work / "p"), "--sparsity", "0.5"]),
        ("densify", ["densify", str(pruned), "-o", str(work / "d")]),
        ("flops", ["flops", "--model", "gpt2-small", "--sparsity", "0.75"]),
        ("simulate", ["simulate", "--model", "gpt2-small", "--sparsity", "0.75"]),
    ]


def measure(cmd: list[str], repeat: int, clean: Path | None = None) -> tuple[float, float, float]:
    """(median CPU s, min CPU s, median wall s) over ``repeat`` runs."""
    cpu, wall = [], []
    for _ in range(repeat):
        if clean is not None:
            shutil.rmtree(clean, ignore_errors=True)
        m = run_measured(cmd, keep_output=False)
        if not m.ok:
            raise SystemExit(f"{' '.join(cmd)} failed ({m.returncode})")
        cpu.append(m.cpu_s)
        wall.append(m.wall_s)
    return statistics.median(cpu), min(cpu), statistics.median(wall)


PROBE = """
import json, sys
from sparsetool.cli.main import main
wanted = json.loads(sys.argv[2])
sys.argv = ["sparsetool", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit:
    pass
print(json.dumps([m for m in wanted if m in sys.modules]))
"""


def loaded(py: str, argv: list[str]) -> list[str]:
    r = subprocess.run(
        [py, "-c", PROBE, json.dumps(argv), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    py = sys.executable
    exe = shutil.which("sparsetool", path=os.path.dirname(py)) or shutil.which("sparsetool")
    if exe is None:
        raise SystemExit("sparsetool is not installed in this environment")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run(
            [exe, "prune", str(TINY), "-o", str(work / "pruned"), "--sparsity", "0.5", "-q"],
            check=True,
        )
        cases: list[tuple[str, list[str], Path | None]] = [
            ("python -c pass (baseline)", [py, "-c", "pass"], None),
            ("python -c 'import typer'", [py, "-c", "import typer"], None),
            ("python -c 'import pydantic'", [py, "-c", "import pydantic"], None),
            ("python -c 'import numpy'", [py, "-c", "import numpy"], None),
            ("sparsetool --version", [exe, "--version"], None),
        ]
        for name, argv in commands(work):
            out = work / "p" if argv[0] == "prune" else work / "d" if argv[0] == "densify" else None
            cases.append((f"sparsetool {name}", [exe, *argv], out))
        rows = []
        for name, cmd, clean in cases:
            rows.append((name, *measure(cmd, args.repeat, clean)))
        for out in ("p", "d"):
            shutil.rmtree(work / out, ignore_errors=True)
        heavy = {name: loaded(py, argv) for name, argv in commands(work)}
    base = rows[0][1]
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"machine: {machine()}")
    print(f"python: {platform.python_version()}; repeat {args.repeat}")
    print(f"command: python benchmarks/bench_startup.py --repeat {args.repeat}")
    print()
    print("| command | median CPU s | min CPU s | median wall s | CPU / baseline |")
    print("|---|---:|---:|---:|---:|")
    for name, cpu, low, wall in rows:
        print(f"| `{name}` | {cpu:.3f} | {low:.3f} | {wall:.3f} | {cpu / base:.1f}x |")
    print()
    print("| command | heavy modules loaded |")
    print("|---|---|")
    for name, mods in heavy.items():
        print(f"| `sparsetool {name}` | {', '.join(mods) or 'none'} |")


if __name__ == "__main__":
    main()
