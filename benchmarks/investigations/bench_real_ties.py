"""Ties of |w| in a checkpoint dequantized from a 4-bit GGUF file, and whether the kernel's tie
rule (ties keep the lower flat index) biases magnitude pruning there.

Q4_1 stores each group of 32 consecutive weights (along the input) as ``d * q + m`` with 4-bit
``q``: 16 distinct values per group, so |w| ties a lot. This script measures, on every targeted
tensor (the q/k/v/o/gate/up/down weights of the blocks):

- ``ties``: how many weights have |w| equal to the layer's threshold at sparsity S (the
  ``keep``-th largest |w|), and how many of them the tie rule prunes;
- ``nm``: for N:M along the input, the fraction of groups of M whose N-th and (N+1)-th largest
  |w| are equal (there the rule decides by position);
- ``--variants DIR``: writes magnitude-pruned copies of the checkpoint with three tie rules
  (``lower``: the kernel's, lower index kept; ``upper``: higher index kept; ``random``: a seeded
  random order among equals), for the layer scope at each ``--sparsity`` and for each ``--nm``,
  plus the masks' disagreement; evaluate them with ``sparsetool eval``. The ``lower`` copy is
  checked to equal ``sparsetool prune``'s own mask when ``--check`` is given;
- ``--mix A B --from-b ROLE ... --out DIR``: a copy of pruned checkpoint A whose tensors of the
  given roles come from B (where a tie rule's effect sits), for ``sparsetool eval``.

Usage (``TIES=benchmarks/investigations/bench_real_ties.py``)::

    PYTHONPATH=. python $TIES /work/real/smollm2 --sparsity 0.5 0.7 --nm 2:4
    PYTHONPATH=. python $TIES /work/real/smollm2 --nm 2:4 --variants /tmp/ties
    sparsetool eval /tmp/ties/nm2-4-lower /tmp/ties/nm2-4-random ... --max-tokens 10K
    PYTHONPATH=. python $TIES /work/real/smollm2 --mix /tmp/ties/nm2-4-lower \
        /tmp/ties/nm2-4-upper --from-b q_proj k_proj v_proj --out /tmp/ties/upper-qkv-only
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from sparsetool.masks.counts import sparsity_keep

TARGET_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def targeted(names: list[str]) -> list[str]:
    return [
        n
        for n in names
        if ".layers." in n and n.endswith(".weight") and any(p in n for p in TARGET_PARTS)
    ]


def tie_order(a: np.ndarray, rule: str, rng: np.random.Generator) -> np.ndarray:
    """Secondary key among equal |w| (higher = kept first) for the rule, same shape as ``a``."""
    n = a.size
    if rule == "lower":
        return (n - np.arange(n)).reshape(a.shape)
    if rule == "upper":
        return np.arange(n).reshape(a.shape)
    return rng.permutation(n).reshape(a.shape)


def layer_mask(w: np.ndarray, keep: int, rule: str, rng: np.random.Generator) -> np.ndarray:
    """Keep the ``keep`` largest |w|, ties by ``rule``; flat order as the kernel's."""
    a = np.abs(w.astype(np.float64)).reshape(-1)
    order = np.lexsort((tie_order(a, rule, rng), a))[::-1]  # last key is primary
    mask = np.zeros(a.size, dtype=bool)
    mask[order[:keep]] = True
    return mask.reshape(w.shape)


def nm_mask(w: np.ndarray, n: int, m: int, rule: str, rng: np.random.Generator) -> np.ndarray:
    """N:M along the input (the last dimension of an (out, in) weight), ties by ``rule``."""
    a = np.abs(w.astype(np.float64)).reshape(-1, m)
    if rule == "lower":
        second = np.broadcast_to(-np.arange(m), a.shape)
    elif rule == "upper":
        second = np.broadcast_to(np.arange(m), a.shape)
    else:
        second = rng.random(a.shape)
    order = np.lexsort((second, a), axis=-1)[:, ::-1]
    mask = np.zeros(a.shape, dtype=bool)
    np.put_along_axis(mask, order[:, :n], True, axis=-1)
    return mask.reshape(w.shape)


def tie_stats(w: np.ndarray, sparsity: float) -> dict:
    a = np.abs(w.astype(np.float64)).reshape(-1)
    keep = sparsity_keep(a.size, sparsity)
    s = np.sort(a)[::-1]
    t = s[keep - 1]
    equal = int(np.count_nonzero(a == t))
    above = int(np.count_nonzero(a > t))
    return {"threshold": float(t), "tied": equal, "tied_pruned": equal - (keep - above)}


def nm_tie_fraction(w: np.ndarray, n: int, m: int) -> float:
    a = np.sort(np.abs(w.astype(np.float64)).reshape(-1, m), axis=-1)[:, ::-1]
    return float(np.mean(a[:, n - 1] == a[:, n]))


def copy_dir(model: Path, dst: Path, tensors: dict[str, np.ndarray]) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for f in model.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, dst / f.name)
    save_file(tensors, str(dst / "model.safetensors"))


def mix(model: Path, a: Path, b: Path, roles: list[str], out: Path) -> None:
    ta, tb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    taken = [k for k in ta if any(r in k for r in roles)]
    copy_dir(model, out, {k: tb[k] if k in taken else v for k, v in ta.items()})
    print(f"{out}: {len(taken)} tensors from {b}, the rest from {a}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", type=Path, help="a Hugging Face directory with model.safetensors")
    ap.add_argument("--sparsity", type=float, nargs="*", default=[0.5, 0.7])
    ap.add_argument("--nm", nargs="*", default=["2:4"])
    ap.add_argument("--variants", type=Path, help="write the pruned copies here")
    ap.add_argument("--rules", nargs="*", default=["lower", "upper", "random"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--check",
        type=Path,
        nargs="*",
        default=[],
        help="sparsetool prune outputs (layer: NAME=DIR) to compare with the lower rule",
    )
    ap.add_argument("--mix", type=Path, nargs=2, metavar=("A", "B"))
    ap.add_argument("--from-b", nargs="*", default=[], metavar="ROLE")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.mix:
        mix(args.model, *args.mix, args.from_b, args.out)
        return
    tensors = load_file(str(args.model / "model.safetensors"))
    names = targeted(sorted(tensors))
    nms = [tuple(int(x) for x in s.split(":")) for s in args.nm]
    per_role: dict[str, dict] = {}
    for name in names:
        w = tensors[name]
        role = next(p for p in TARGET_PARTS if p in name)
        r = per_role.setdefault(
            role,
            {
                "tensors": 0,
                "numel": 0,
                "distinct_per_32": [],
                **{f"tied@{s}": [] for s in args.sparsity},
                **{f"nm{n}:{m}": [] for n, m in nms},
            },
        )
        r["tensors"] += 1
        r["numel"] += w.size
        g = np.abs(w.reshape(-1, 32))
        r["distinct_per_32"].append(float(np.mean([np.unique(x).size for x in g[:2000]])))
        for s in args.sparsity:
            r[f"tied@{s}"].append(tie_stats(w, s))
        for n, m in nms:
            r[f"nm{n}:{m}"].append(nm_tie_fraction(w, n, m))
    rows = []
    for role, r in per_role.items():
        row = {
            "role": role,
            "tensors": r["tensors"],
            "numel per tensor": r["numel"] // r["tensors"],
            "distinct |w| per group of 32": round(float(np.mean(r["distinct_per_32"])), 2),
        }
        for s in args.sparsity:
            st = r[f"tied@{s}"]
            row[f"tied at threshold {s:.0%} (median, max)"] = (
                int(np.median([x["tied"] for x in st])),
                max(x["tied"] for x in st),
            )
            row[f"tie-pruned {s:.0%} (median)"] = int(np.median([x["tied_pruned"] for x in st]))
        for n, m in nms:
            row[f"{n}:{m} groups tied at the cut"] = f"{np.mean(r[f'nm{n}:{m}']):.1%}"
        rows.append(row)
    print(json.dumps(rows, indent=1))

    if args.variants is None:
        return
    rng = np.random.default_rng(args.seed)
    jobs = [(f"layer{int(round(s * 100))}", ("layer", s)) for s in args.sparsity]
    jobs += [(f"nm{n}-{m}", ("nm", (n, m))) for n, m in nms]
    for label, (kind, arg) in jobs:
        masks: dict[str, dict[str, np.ndarray]] = {}
        for rule in args.rules:
            out = dict(tensors)
            masks[rule] = {}
            for name in names:
                w = tensors[name]
                if kind == "layer":
                    mk = layer_mask(w, sparsity_keep(w.size, arg), rule, rng)
                else:
                    mk = nm_mask(w, arg[0], arg[1], rule, rng)
                masks[rule][name] = mk
                out[name] = np.where(mk, w, np.zeros_like(w))
            copy_dir(args.model, args.variants / f"{label}-{rule}", out)
        base = masks[args.rules[0]]
        for rule in args.rules[1:]:
            differ = sum(int(np.count_nonzero(base[k] != masks[rule][k])) for k in names) // 2
            kept = sum(int(np.count_nonzero(base[k])) for k in names)
            print(
                f"{label}: {args.rules[0]} vs {rule}: {differ:,} of {kept:,} kept weights differ "
                f"({differ / kept:.3%})"
            )
        for spec in args.check:
            lab, _, path = str(spec).partition("=")
            if lab != label:
                continue
            mine = load_file(str(Path(path) / "model.safetensors"))
            same = all(
                np.array_equal(mine[k] != 0, masks["lower"][k] & (tensors[k] != 0)) for k in names
            )
            print(f"{label}: sparsetool prune's mask equals the lower rule's: {same}")


if __name__ == "__main__":
    main()
