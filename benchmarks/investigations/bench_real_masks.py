"""Agreement of two pruned checkpoints of the same model: per targeted tensor, the fraction of the
kept weights of A that B prunes (and the other way round), and for the kept weights in both the
largest relative change of value (SparseGPT changes the kept weights; Wanda keeps them bit for
bit). Zeros are read as pruned (the zeros encoding).

Usage::

    PYTHONPATH=. python benchmarks/investigations/bench_real_masks.py \
        /tmp/wanda-float32 /tmp/wanda-bfloat16
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from safetensors import safe_open

TARGET_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    args = ap.parse_args()
    fa = safe_open(str(args.a / "model.safetensors"), "np")
    fb = safe_open(str(args.b / "model.safetensors"), "np")
    names = [n for n in fa.keys() if ".layers." in n and any(p in n for p in TARGET_PARTS)]
    kept = differ = 0
    per_role: dict[str, list[int]] = {}
    worst = 0.0
    rel = []
    for n in names:
        a, b = fa.get_tensor(n), fb.get_tensor(n)
        ka, kb = a != 0, b != 0
        d = int(np.count_nonzero(ka & ~kb))
        kept += int(ka.sum())
        differ += d
        role = next(p for p in TARGET_PARTS if p in n)
        r = per_role.setdefault(role, [0, 0])
        r[0] += d
        r[1] += int(ka.sum())
        both = ka & kb
        change = np.abs(a[both].astype(np.float64) - b[both]) / np.maximum(np.abs(a[both]), 1e-12)
        worst = max(worst, float(change.max()) if change.size else 0.0)
        rel.append(float(np.median(change)) if change.size else 0.0)
    print(
        f"{args.a.name} vs {args.b.name}: {differ:,} of {kept:,} kept weights of A are pruned in B "
        f"({differ / kept:.2%}); median relative change of the weights kept in both "
        f"{np.median(rel):.2e}, max {worst:.2e}"
    )
    for role, (d, k) in per_role.items():
        print(f"  {role:10} {d / k:.2%}")


if __name__ == "__main__":
    main()
