"""Cost of the sparse-training algorithms on GPT-2-small-shaped matrices (CPU).

Measures, for ``--layers`` blocks of GPT-2 small (qkv 2304x768, attention out 768x768, FFN in
3072x768, FFN out 768x3072) at 75% sparsity:

- one RigL mask update (drop by |w|, grow by |grad|), with the kernel's ``top_k_mask`` as shipped
  and with a baseline that takes the top-k by a full stable sort (same result, checked);
- the per-step overhead of ``before_step`` + ``after_step`` on a step without an update, against
  the AdamW ``optimizer.step()`` it wraps.

    python benchmarks/bench_algorithms.py --layers 2 --repeat 3
"""

from __future__ import annotations

import argparse
import time
from unittest import mock

import torch

import sparsetool.train.algorithms.base as base
from sparsetool.masks.kernel import top_k_mask
from sparsetool.train.algorithms import build_sparsifier


def sort_top_k(scores, k, allowed=None):
    """Baseline: a full stable descending sort (ties keep the lower flat index)."""
    flat = scores.detach().reshape(-1).float()
    out = flat.isnan() if allowed is None else flat.isnan() | ~allowed.reshape(-1)
    flat = flat.masked_fill(out, float("-inf"))
    mask = torch.zeros(flat.numel(), dtype=torch.bool)
    mask[torch.sort(flat, descending=True, stable=True).indices[:k]] = True
    mask &= ~out  # NaN and not-allowed are never selected
    return mask.reshape(scores.shape)


def make(layers: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    shapes = {
        "attn.qkv": (2304, 768),
        "attn.proj": (768, 768),
        "mlp.fc": (3072, 768),
        "mlp.proj": (768, 3072),
    }
    params = {}
    for i in range(layers):
        for leaf, shape in shapes.items():
            p = torch.nn.Parameter(torch.randn(shape, generator=g) * 0.02)
            p.grad = torch.randn(shape, generator=g)
            params[f"blocks.{i}.{leaf}.weight"] = p
    opt = torch.optim.AdamW(params.values(), lr=1e-4)
    sp = build_sparsifier(
        {
            "algorithm": "rigl",
            "sparsity": 0.75,
            "drop_fraction": 0.3,
            "update": {"freq": 1, "start": 0, "stop": 1000},
        }
    )
    sp.attach(params, opt, 1000)
    return params, opt, sp


def best(fn, repeat):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    params, opt, sp = make(args.layers)
    numel = sum(p.numel() for p in params.values())
    opt.step()  # create the AdamW state so every timing below includes it

    start = {n: m.clone() for n, m in sp.masks.items()}
    start_w = {n: p.detach().clone() for n, p in params.items()}
    start_g = {n: p.grad.clone() for n, p in params.items()}
    results = {}
    masks_by = {}
    for label, fn in (("top_k_mask (shipped)", top_k_mask), ("stable sort (baseline)", sort_top_k)):
        # Sparsifier takes no selection function: the update looks top_k_mask up in base's
        # namespace, so it is swapped there for this timing only
        swap = mock.patch.object(base, "top_k_mask", fn)
        swap.start()

        def update():
            # the same starting point every time: an update zeroes the weights it drops
            with torch.no_grad():
                for n, p in params.items():
                    p.copy_(start_w[n])
                    p.grad.copy_(start_g[n])
            sp.masks = {n: m.clone() for n, m in start.items()}
            sp.before_step(0)

        results[label] = best(update, args.repeat)
        masks_by[label] = {n: m.clone() for n, m in sp.masks.items()}
        swap.stop()
    same = all(
        torch.equal(masks_by["top_k_mask (shipped)"][n], masks_by["stable sort (baseline)"][n])
        for n in params
    )

    def plain_step():
        opt.step()

    with torch.no_grad():
        for n, p in params.items():
            p.grad.copy_(start_g[n])

    def wrapped_step():
        sp.before_step(1001)  # past the update window: masking only
        opt.step()
        sp.after_step(1001)

    t_opt = best(plain_step, args.repeat)
    t_wrapped = best(wrapped_step, args.repeat)

    print(
        f"{args.layers} GPT-2-small blocks, {len(params)} matrices, {numel / 1e6:.1f}M weights, "
        f"75% sparse, best of {args.repeat}; identical masks: {same}"
    )
    print("| work | seconds | ratio |")
    print("|---|---:|---:|")
    b = results["stable sort (baseline)"]
    for label, t in results.items():
        print(f"| RigL mask update, {label} | {t:.3f} | {t / b:.2f}x |")
    print(f"| AdamW step alone (baseline) | {t_opt:.3f} | 1.00x |")
    print(f"| before_step + AdamW step + after_step | {t_wrapped:.3f} | {t_wrapped / t_opt:.2f}x |")


if __name__ == "__main__":
    main()
