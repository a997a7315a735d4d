"""Checkpoint-engine benchmark: prune / densify / report against `cp` and a naive script.

Makes a GPT-3-XL-shaped bf16 checkpoint (24 layers, d_model 2048, FFN 8192, vocab 50257,
GPT-2 tensor naming; about 2.6 GB), then times, in one run and on the same warm page cache:

* ``cp`` of the file (the baseline every ratio is relative to),
* ``python -c "import torch"``: the start-up floor every sparsetool command pays,
* a naive script: ``load_file`` everything, prune each targeted tensor with ``torch.kthvalue``,
  ``save_file`` everything,
* ``sparsetool prune`` (layer and global scope), ``densify`` and ``report``.

Wall time and peak RSS of each command come from ``os.wait4`` on the child process. Each command
runs ``--repeat`` times; the best wall time is kept (shared, noisy machine).

    python benchmarks/bench_checkpoint.py --workdir /tmp/sparsetool-bench [--layers 24]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

NAIVE = r"""
import sys, torch
from safetensors.torch import load_file, save_file
state = load_file(sys.argv[1])
for name, w in state.items():
    if name.endswith(("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")):
        k = round(0.75 * w.numel())
        thr = w.abs().float().flatten().kthvalue(k).values
        state[name] = torch.where(w.abs().float() > thr, w, torch.zeros_like(w))
save_file(state, sys.argv[2], metadata={"format": "pt"})
"""


def make_checkpoint(path: Path, layers: int, d: int = 2048, ffn: int = 8192,
                    vocab: int = 50257, ctx: int = 2048) -> int:
    """Stream a random bf16 checkpoint to ``path`` (one tensor in memory at a time)."""
    import torch

    shapes: dict[str, tuple[int, ...]] = {"transformer.wte.weight": (vocab, d),
                                          "transformer.wpe.weight": (ctx, d)}
    for i in range(layers):
        p = f"transformer.h.{i}."
        shapes |= {p + "ln_1.weight": (d,), p + "ln_1.bias": (d,),
                   p + "attn.c_attn.weight": (d, 3 * d), p + "attn.c_attn.bias": (3 * d,),
                   p + "attn.c_proj.weight": (d, d), p + "attn.c_proj.bias": (d,),
                   p + "ln_2.weight": (d,), p + "ln_2.bias": (d,),
                   p + "mlp.c_fc.weight": (d, ffn), p + "mlp.c_fc.bias": (ffn,),
                   p + "mlp.c_proj.weight": (ffn, d), p + "mlp.c_proj.bias": (d,)}
    shapes |= {"transformer.ln_f.weight": (d,), "transformer.ln_f.bias": (d,)}
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in sorted(shapes):
        n = 2
        for s in shapes[name]:
            n *= s
        header[name] = {"dtype": "BF16", "shape": list(shapes[name]),
                        "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    gen = torch.Generator().manual_seed(0)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for name in sorted(shapes):
            t = (torch.randn(shapes[name], generator=gen) * 0.02).to(torch.bfloat16)
            f.write(t.view(torch.uint8).numpy().tobytes())
    return path.stat().st_size


def timed(cmd: list[str], work: Path | None = None) -> tuple[float, float]:
    """(wall seconds, peak RSS in MB) of one child process.

    Every run starts equal: earlier outputs are deleted and dirty pages flushed first (untimed),
    so no command pays for the write-back of the one before it.
    """
    if work is not None:
        for p in work.glob("*.safetensors"):
            if p.name not in ("gpt3xl.safetensors", "pruned.safetensors"):
                p.unlink()
    os.sync()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stderr.read().decode()}")
    return wall, usage.ru_maxrss / 1024


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {platform.machine()}, {cpu}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/sparsetool-bench"))
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--skip-naive", action="store_true")
    args = ap.parse_args()
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    src = work / "gpt3xl.safetensors"
    if not src.exists():
        print("making checkpoint ...", flush=True)
        make_checkpoint(src, args.layers)
    size = src.stat().st_size
    st = [sys.executable, "-m", "sparsetool"]
    pruned = work / "pruned.safetensors"
    cases = [
        ("cp", ["cp", str(src), str(work / "copy.safetensors")]),
        # the floor of any sparsetool command: starting Python and importing torch
        ("python -c 'import torch'", [sys.executable, "-c", "import torch"]),
        ("naive load/prune/save", [sys.executable, "-c", NAIVE, str(src), str(work / "naive.safetensors")]),
        ("prune --scope layer", st + ["prune", str(src), "-o", str(pruned), "--sparsity", "0.75"]),
        ("prune --scope global", st + ["prune", str(src), "-o", str(work / "global.safetensors"),
                                       "--sparsity", "0.75", "--scope", "global"]),
        ("densify", st + ["densify", str(pruned), "-o", str(work / "dense.safetensors")]),
        ("report", st + ["report", str(pruned), "--json"]),
    ]
    if args.skip_naive:
        cases = [c for c in cases if not c[0].startswith("naive")]
    timed(["cat", str(src)])  # warm the page cache so every command starts equal
    results = {}
    for label, cmd in cases:
        runs = [timed(cmd, work) for _ in range(args.repeat if not label.startswith("naive") else 1)]
        wall = min(r[0] for r in runs)
        rss = max(r[1] for r in runs)
        results[label] = (wall, rss)
        print(f"{label:24s} {wall:7.2f} s  {rss:8.0f} MB", flush=True)
    base = results["cp"][0]
    targets = {"prune --scope layer": 2.0, "prune --scope global": 3.0, "densify": 1.5, "report": 1.0}
    print(f"\n{time.strftime('%Y-%m-%d', time.gmtime())}; {machine()}; "
          f"checkpoint {size / 1e9:.2f} GB ({args.layers} layers, bf16)")
    print("| command | wall (s) | x cp | peak RSS (MB) | target |")
    print("|---|---:|---:|---:|---|")
    for label, (wall, rss) in results.items():
        goal = targets.get(label)
        verdict = ""
        if goal is not None:
            ok = wall <= goal * base and rss <= 600
            verdict = f"<= {goal}x cp, <= 600 MB: {'met' if ok else 'MISSED'}"
        print(f"| {label} | {wall:.2f} | {wall / base:.2f} | {rss:.0f} | {verdict} |")
    for p in work.glob("*.safetensors"):
        if p != src:
            p.unlink()
    shutil.rmtree(work / "tmp", ignore_errors=True)


if __name__ == "__main__":
    main()
