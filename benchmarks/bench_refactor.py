"""Every command before and after a refactor, timed in the same run: no command may get slower.

Give two installed ``sparsetool`` executables (e.g. one venv per commit). Each case runs
``--repeat`` times per side, the two sides alternating run by run so that load from other
processes hits both alike; the median wall time of each side and their ratio (new / base) are
printed as a markdown table, for wall time and for the CPU time (user + system) of the child,
which moves much less when other work shares the machine. Outputs are byte-compared where a
command writes a checkpoint.

    python benchmarks/bench_refactor.py --base /path/base/bin/sparsetool \\
        --new /path/new/bin/sparsetool [--groups startup,flops,simulate,data,train] [--repeat 7]
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import statistics
import subprocess
import time
from pathlib import Path

from bench_checkpoint import make_checkpoint
from measure import machine, run_measured


def cases(work: Path) -> dict[str, list[tuple[str, list[str], bool]]]:
    """group -> [(label, arguments, expected to succeed)]. ``{out}`` is the side's output path."""
    ck = str(work / "model.safetensors")
    pruned = str(work / "pruned.safetensors")
    corpus = str(work / "corpus.txt")
    return {
        "startup": [
            ("--help", ["--help"], True),
            ("--version", ["--version"], True),
            ("prune --help", ["prune", "--help"], True),
            ("usage error (prune x --sparsity 2)", ["prune", "x", "--sparsity", "2"], False),
        ],
        "flops": [
            ("flops --model gpt3-xl -s 0.75", ["flops", "--model", "gpt3-xl", "-s", "0.75"], True),
            ("flops --checkpoint (pruned)", ["flops", "--checkpoint", pruned], True),
        ],
        "simulate": [
            (
                "simulate --model gpt3-xl --device cs2",
                ["simulate", "--model", "gpt3-xl", "--device", "cs2", "--sparsity", "0.75"],
                True,
            ),
            (
                "simulate --shape 4096x4096 -s 0.9",
                ["simulate", "--shape", "4096x4096", "--sparsity", "0.9"],
                True,
            ),
            ("simulate CHECKPOINT (pruned)", ["simulate", pruned], True),
        ],
        "data": [
            ("prune -s 0.75", ["prune", ck, "-o", "{out}", "--sparsity", "0.75"], True),
            (
                "prune -s 0.75 --scope global",
                ["prune", ck, "-o", "{out}", "--sparsity", "0.75", "--scope", "global"],
                True,
            ),
            ("prune --nm 2:4", ["prune", ck, "-o", "{out}", "--nm", "2:4"], True),
            ("densify (pruned)", ["densify", pruned, "-o", "{out}"], True),
            ("report (pruned) --json", ["report", pruned, "--json"], True),
        ],
        "train": [
            (
                "train --preset tiny --steps 30 rigl",
                [
                    "train",
                    "--out",
                    "{out}",
                    "--preset",
                    "tiny",
                    "--steps",
                    "30",
                    "--algorithm",
                    "rigl",
                    "--sparsity",
                    "0.75",
                    "--data",
                    corpus,
                    "--seed",
                    "0",
                ],
                True,
            ),
        ],
    }


def run(exe: str, args: list[str], out: Path, ok: bool) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system of the child). CPU time is the steadier figure
    on a machine shared with other work; wall time is what a user waits."""
    if out.is_dir():
        shutil.rmtree(out)
    elif out.exists():
        out.unlink()
    argv = [exe] + [a.replace("{out}", str(out)) for a in args]
    m = run_measured(argv)
    if m.ok != ok:
        raise SystemExit(f"unexpected exit {m.returncode}: {' '.join(argv)}\n{m.stderr}")
    return m.wall_s, m.cpu_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the sparsetool executable before the change")
    ap.add_argument("--new", required=True, help="the sparsetool executable after the change")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/sparsetool-bench-refactor"))
    ap.add_argument("--groups", default="startup,flops,simulate,data,train")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument(
        "--layers", type=int, default=4, help="layers of the GPT-3-XL-shaped checkpoint"
    )
    args = ap.parse_args()
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "model.safetensors").exists():
        make_checkpoint(work / "model.safetensors", args.layers)
    (work / "corpus.txt").write_text(
        "".join(f"def f{i}(x):\n    return x * {i}\n\n" for i in range(2000))
    )
    subprocess.run(
        [
            args.new,
            "prune",
            str(work / "model.safetensors"),
            "-o",
            str(work / "pruned.safetensors"),
            "--sparsity",
            "0.75",
            "--quiet",
        ],
        check=True,
    )
    groups = cases(work)
    rows = []
    for group in args.groups.split(","):
        for label, argv, ok in groups[group]:
            times: dict[str, list[float]] = {"base": [], "new": []}
            cpu: dict[str, list[float]] = {"base": [], "new": []}
            for i in range(args.repeat):
                order = ("base", "new") if i % 2 == 0 else ("new", "base")
                for side in order:
                    exe = args.base if side == "base" else args.new
                    wall, used = run(exe, argv, work / f"out-{side}", ok)
                    times[side].append(wall)
                    cpu[side].append(used)
            same = ""
            a, b = work / "out-base", work / "out-new"
            if a.is_file() and b.is_file():
                same = "identical" if filecmp.cmp(a, b, shallow=False) else "DIFFERENT"
            base, new = statistics.median(times["base"]), statistics.median(times["new"])
            cb, cn = statistics.median(cpu["base"]), statistics.median(cpu["new"])
            rows.append((group, label, base, new, cb, cn, same))
            print(
                f"{group:9s} {label:40s} wall {base:7.3f} -> {new:7.3f} s x{new / base:5.2f}  "
                f"cpu {cb:7.3f} -> {cn:7.3f} s x{cn / cb:5.2f} {same}",
                flush=True,
            )
    print(
        f"\n{time.strftime('%Y-%m-%d', time.gmtime())}; {machine()}; median of {args.repeat} "
        f"alternating runs per side; checkpoint: GPT-3-XL-shaped, {args.layers} layers, bf16"
    )
    print(
        "| group | command | wall base (s) | wall new (s) | wall new/base | CPU base (s) | CPU "
        "new (s) | CPU new/base | output |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for group, label, base, new, cb, cn, same in rows:
        print(
            f"| {group} | `{label}` | {base:.3f} | {new:.3f} | {new / base:.2f} | {cb:.3f} | "
            f"{cn:.3f} | {cn / cb:.2f} | {same} |"
        )


if __name__ == "__main__":
    main()
