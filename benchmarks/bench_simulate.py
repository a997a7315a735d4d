"""Benchmark `sparsetool simulate`: the 12k x 12k analysis and a whole GPT-3 XL checkpoint.

Targets: the 12288 x 12288 analysis (144M mask entries: draw the mask, count non-zeros per core
group, check 2:4, time every device) under 3 s; a whole GPT-3 XL checkpoint (1.3B parameters,
bf16, 75% sparse, real masks read from disk) under 30 s. Baselines in the same run: drawing the
same mask the naive way (``torch.rand(...) < density``), and only reading every targeted tensor
of the checkpoint (``safetensors.safe_open``) and counting its non-zeros, so the ratios say what the
analysis costs on top.

    python benchmarks/bench_simulate.py            # both
    python benchmarks/bench_simulate.py --skip-checkpoint
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def best_of(fn, n):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times), statistics.median(times)


def bench_12k(repeats: int) -> None:
    import torch

    from sparsetool.hardware import builtin_devices, from_shape, simulate
    from sparsetool.hardware.presets import dataflow_grids

    devices = builtin_devices()
    grids = dataflow_grids(list(devices.values()))

    def analysis():
        wl, _ = from_shape((12288, 12288), 0.9, 2048, grids)
        simulate(wl, devices)

    def naive_mask():
        (torch.rand(12288, 12288) < 0.1).sum()

    a_min, a_med = best_of(analysis, repeats)
    b_min, b_med = best_of(naive_mask, repeats)
    t = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "sparsetool",
            "simulate",
            "--shape",
            "12288x12288",
            "--sparsity",
            "0.9",
            "--tokens",
            "2048",
            "--json",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    cli = time.perf_counter() - t
    print(f"12288x12288 at 0.9, 2048 tokens, {len(devices)} devices ({repeats} runs)")
    print(f"  analysis in-process: min {a_min:.2f} s, median {a_med:.2f} s   (target < 3 s)")
    print(f"  baseline torch.rand(...) < d, count: min {b_min:.2f} s, median {b_med:.2f} s")
    print(f"  ratio analysis / baseline (min): {a_min / b_min:.2f}")
    print(f"  CLI end to end (process start, imports, JSON): {cli:.2f} s")


def make_gpt3_xl(path: Path) -> None:
    """GPT-3 XL shapes (SPDF App. A.1: 24 layers, d 2048, d_ff 8192, vocab 50257, context 2048)
    named like GPT-2 (Conv1D (in, out)), bf16, targeted matrices 75% sparse (zeros encoding)."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    d, f, L, V, S = 2048, 8192, 24, 50257, 2048

    def w(*shape, prune=False):
        t = torch.randn(*shape, generator=g, dtype=torch.float32)
        if prune:
            t *= torch.rand(*shape, generator=g) >= 0.75
        return t.to(torch.bfloat16)

    state = {"transformer.wte.weight": w(V, d), "transformer.wpe.weight": w(S, d)}
    for i in range(L):
        p = f"transformer.h.{i}."
        state |= {
            p + "ln_1.weight": torch.ones(d, dtype=torch.bfloat16),
            p + "attn.c_attn.weight": w(d, 3 * d, prune=True),
            p + "attn.c_proj.weight": w(d, d, prune=True),
            p + "ln_2.weight": torch.ones(d, dtype=torch.bfloat16),
            p + "mlp.c_fc.weight": w(d, f, prune=True),
            p + "mlp.c_proj.weight": w(f, d, prune=True),
        }
    save_file(state, str(path), metadata={"format": "pt"})


def bench_checkpoint(workdir: Path) -> None:
    from safetensors import safe_open

    from sparsetool.hardware import builtin_devices, from_checkpoint, simulate
    from sparsetool.hardware.presets import dataflow_grids
    from sparsetool.targets import is_targeted

    path = workdir / "gpt3-xl-75.safetensors"
    t = time.perf_counter()
    make_gpt3_xl(path)
    print(
        f"GPT-3 XL checkpoint written in {time.perf_counter() - t:.1f} s, "
        f"{path.stat().st_size / 1e9:.2f} GB (bf16; in the page cache from here on)"
    )
    devices = builtin_devices()
    grids = dataflow_grids(list(devices.values()))

    def analysis():
        simulate(from_checkpoint(path, 4096, grids), devices)

    def read_only():
        with safe_open(str(path), "pt") as fh:
            for name in fh.keys():
                sl = fh.get_slice(name)
                if is_targeted(name, sl.get_shape(), sl.get_dtype()):
                    int(fh.get_tensor(name).count_nonzero())  # touch every byte once

    a_min, a_med = best_of(analysis, 2)
    b_min, b_med = best_of(read_only, 2)
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "sparsetool", "simulate", str(path), "--tokens", "4096", "--json"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    cli = time.perf_counter() - t
    print("GPT-3 XL, 96 targeted matrices (1.2B mask entries), 4096 tokens (2 runs)")
    print(f"  analysis in-process: min {a_min:.2f} s, median {a_med:.2f} s   (target < 30 s)")
    print(
        f"  baseline read targeted tensors + count_nonzero: min {b_min:.2f} s, median {b_med:.2f} s"
    )
    print(f"  ratio analysis / baseline (min): {a_min / b_min:.2f}")
    print(f"  CLI end to end: {cli:.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-checkpoint", action="store_true")
    args = ap.parse_args()
    bench_12k(args.repeats)
    if not args.skip_checkpoint:
        with tempfile.TemporaryDirectory(prefix="bench-simulate-") as tmp:
            bench_checkpoint(Path(tmp))


if __name__ == "__main__":
    main()
