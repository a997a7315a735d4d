"""Magnitude selection: sparsetool's exact radix select against torch.topk and torch.kthvalue.

Usage: python benchmarks/bench_masks.py [--rows 2048] [--cols 8192] [--repeat 5] [--sparsity 0.5]

Every method builds a bool mask keeping round((1 - S) * numel) weights of a seeded random matrix.
torch.topk (k largest |w|, then scatter) and torch.kthvalue (threshold, then compare) are the usual
ways; neither breaks ties deterministically, and kthvalue + ">" is not exact when values tie.
Prints one row per (dtype, method): median seconds and ratio to sparsetool (>1 = slower than ours).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from sparsetool.masks import (
    MagnitudeHistogram,
    apply_threshold,
    global_threshold_plan,
    magnitude_mask,
    nm_mask,
    random_mask,
    sparsity_keep,
)


def timed(fn, repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def topk_mask(w: torch.Tensor, keep: int) -> torch.Tensor:
    flat = w.abs().reshape(-1)
    mask = torch.zeros(flat.numel(), dtype=torch.bool)
    mask[torch.topk(flat, keep, sorted=False).indices] = True
    return mask.reshape(w.shape)


def kthvalue_mask(w: torch.Tensor, keep: int) -> torch.Tensor:
    a = w.abs()
    # kthvalue is not implemented for bf16/fp16 on CPU in every torch; go through fp32 then
    flat = a.reshape(-1) if a.dtype in (torch.float32, torch.float64) else a.reshape(-1).float()
    threshold = torch.kthvalue(flat, a.numel() - keep).values
    return a > threshold.to(a.dtype)


def topk_nm_mask(w: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """The usual N:M recipe: top-n of |w| in each group of m along the last dimension."""
    groups = w.abs().reshape(-1, m)
    mask = torch.zeros_like(groups, dtype=torch.bool)
    mask.scatter_(1, torch.topk(groups, n, dim=1).indices, True)
    return mask.reshape(w.shape)


def randperm_mask(shape: torch.Size, keep: int) -> torch.Tensor:
    """The usual random recipe: the first `keep` positions of a random permutation."""
    mask = torch.zeros(shape.numel(), dtype=torch.bool)
    mask[torch.randperm(shape.numel(), generator=torch.Generator().manual_seed(0))[:keep]] = True
    return mask.reshape(shape)


def global_mask(w: torch.Tensor, keep: int) -> torch.Tensor:
    """The streaming global protocol on one tensor (both passes and the apply)."""
    hists = [MagnitudeHistogram.of(w)]
    plan = global_threshold_plan(hists, keep)
    if not plan.done:
        plan = global_threshold_plan(
            hists, keep, refined={0: MagnitudeHistogram.of(w, refine=plan.refine_bucket)}
        )
    return apply_threshold(w, plan.tensors[0])


def global_masks_streaming(tensors: list[torch.Tensor], keep: int) -> list[torch.Tensor]:
    """The pass protocol as a streaming caller runs it (one tensor at a time in each pass)."""
    hists = [MagnitudeHistogram.of(t) for t in tensors]
    plan = global_threshold_plan(hists, keep)
    if not plan.done:
        fine = {
            i: MagnitudeHistogram.of(tensors[i], refine=plan.refine_bucket) for i in plan.refine
        }
        plan = global_threshold_plan(hists, keep, refined=fine)
    return [apply_threshold(t, p) for t, p in zip(tensors, plan.tensors)]


def global_masks_in_memory(tensors: list[torch.Tensor], keep: int) -> list[torch.Tensor]:
    """The usual in-memory way: all |w| concatenated, one kthvalue threshold (ties not exact)."""
    scores = torch.cat([t.float().abs().reshape(-1) for t in tensors])
    threshold = torch.kthvalue(scores, scores.numel() - keep).values
    return [t.float().abs() > threshold for t in tensors]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--cols", type=int, default=8192)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--sparsity", type=float, default=0.5)
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{args.rows}x{args.cols}, sparsity {args.sparsity}, median of {args.repeat}"
    )
    print(f"{'dtype':9} {'method':28} {'seconds':>9} {'vs ours':>8}")
    g = torch.Generator().manual_seed(0)
    dense = torch.randn(args.rows, args.cols, generator=g)
    for dtype in (torch.bfloat16, torch.float32):
        w = dense.to(dtype)
        keep = sparsity_keep(w.numel(), args.sparsity)
        ours = timed(lambda w=w: magnitude_mask(w, args.sparsity), args.repeat)
        mask = magnitude_mask(w, args.sparsity)
        assert int(mask.sum()) == keep
        assert int(random_mask(w.shape, args.sparsity, seed=0).sum()) == keep
        assert int(nm_mask(w, 2, 4).sum()) == w.numel() // 2
        assert int(global_mask(w, keep).sum()) == keep
        rows = [("sparsetool magnitude_mask", ours)]
        rows.append(
            ("torch.topk + scatter", timed(lambda w=w, keep=keep: topk_mask(w, keep), args.repeat))
        )
        rows.append(
            (
                "torch.kthvalue + compare",
                timed(lambda w=w, keep=keep: kthvalue_mask(w, keep), args.repeat),
            )
        )
        rows.append(
            (
                "sparsetool global (1 tensor)",
                timed(lambda w=w, keep=keep: global_mask(w, keep), args.repeat),
            )
        )
        for name, seconds in rows:
            print(
                f"{str(dtype).replace('torch.', ''):9} {name:28} {seconds:9.4f} "
                f"{seconds / ours:8.2f}"
            )
        # other selections, each against its own usual recipe
        pairs = [
            (
                "sparsetool nm_mask 2:4",
                lambda w=w: nm_mask(w, 2, 4),
                "torch.topk per group of 4",
                lambda w=w: topk_nm_mask(w, 2, 4),
            ),
            (
                "sparsetool random_mask",
                lambda w=w: random_mask(w.shape, args.sparsity, seed=0),
                "torch.randperm",
                lambda w=w, keep=keep: randperm_mask(w.shape, keep),
            ),
        ]
        tensors = [dense[:, i * 1024 : (i + 1) * 1024].to(dtype).contiguous() for i in range(8)]
        pairs.append(
            (
                "global, 8 tensors, streamed",
                lambda tensors=tensors, keep=keep: global_masks_streaming(tensors, keep),
                "cat + kthvalue in memory",
                lambda tensors=tensors, keep=keep: global_masks_in_memory(tensors, keep),
            )
        )
        for name, fn, base_name, base_fn in pairs:
            mine, theirs = timed(fn, args.repeat), timed(base_fn, args.repeat)
            print(f"{str(dtype).replace('torch.', ''):9} {name:28} {mine:9.4f} {1.0:8.2f}")
            print(
                f"{str(dtype).replace('torch.', ''):9} {base_name:28} {theirs:9.4f} "
                f"{theirs / mine:8.2f}"
            )


if __name__ == "__main__":
    main()
