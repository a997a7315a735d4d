"""Outlier input features of a real model: the per-channel input norms ||X_j||_2 that Wanda
multiplies |W_ij| by, measured on the calibration text through the dense model.

For every targeted linear layer of every block (q/k/v share one input, gate/up another) it
accumulates each input channel's sum of squares over ``--samples`` windows of ``--seq`` tokens
(picked as ``sparsetool prune --method wanda`` picks them: ``calibration_windows`` with
``--seed``), then reports per block and input: the mean norm, the largest norm over the mean, how
many channels exceed 5x and 20x the mean, and the largest channels' indices (the same residual
channels recur from block to block). ``--owl M`` adds each block's share of Wanda scores
``|W_ij| * ||X_j||`` above M times the layer's mean score (the "outlier ratio" OWL allots
sparsity by), and ``--ties`` the Wanda score ties at each row's cut at 50% sparsity.

Usage::

    PYTHONPATH=. python benchmarks/investigations/bench_real_outliers.py /work/real/smollm2 \
        --calibration /work/real/text/sciq-calibration.txt --samples 16 --seq 256 --owl 5 --ties
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from sparsetool.ops.calibration import calibration_windows

INPUTS = {"q_proj": "attn_in", "o_proj": "attn_out", "gate_proj": "mlp_in", "down_proj": "mlp_mid"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--calibration", type=Path, required=True)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--owl", type=float, default=0.0)
    ap.add_argument("--ties", action="store_true")
    ap.add_argument("--json", type=Path, help="write every figure here")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    ids = tok(args.calibration.read_text(encoding="utf-8")).input_ids
    windows = calibration_windows(ids, args.samples, args.seq, args.seed, str(args.calibration))
    sq: dict[str, torch.Tensor] = {}
    linears = {}
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and ".layers." in name:
            linears[name] = mod

            def hook(m, a, out, name=name):
                x = a[0].detach().reshape(-1, a[0].shape[-1]).double()
                sq[name] = sq.get(name, 0) + x.pow(2).sum(0)

            mod.register_forward_hook(hook)
    with torch.no_grad():
        for w in windows:
            model(w.unsqueeze(0))
    rows = []
    for name, s in sq.items():
        role = name.rsplit(".", 1)[-1]
        block = int(name.split(".layers.")[1].split(".")[0])
        norms = s.sqrt()
        mean = float(norms.mean())
        row = {
            "block": block,
            "role": role,
            "mean": mean,
            "max/mean": float(norms.max()) / mean,
            ">5x": int((norms > 5 * mean).sum()),
            ">20x": int((norms > 20 * mean).sum()),
            "top": norms.topk(3).indices.tolist(),
        }
        w = linears[name].weight.detach().double()
        score = w.abs() * norms.unsqueeze(0)
        if args.owl:
            row["owl"] = float((score > args.owl * score.mean()).double().mean())
        if args.ties:
            keep = w.shape[1] // 2
            srt = score.sort(dim=1, descending=True).values
            row["wanda_rows_tied_at_cut"] = float(
                (srt[:, keep - 1] == srt[:, keep]).double().mean()
            )
            a = w.abs().sort(dim=1, descending=True).values
            row["magnitude_rows_tied_at_cut"] = float(
                (a[:, keep - 1] == a[:, keep]).double().mean()
            )
        rows.append(row)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print(
        f"{'block':>5} {'input':9} {'mean':>8} {'max/mean':>9} {'>5x':>4} {'>20x':>4}  top channels"
        + ("  owl" if args.owl else "")
    )
    for r in rows:
        if r["role"] not in INPUTS:
            continue
        print(
            f"{r['block']:>5} {INPUTS[r['role']]:9} {r['mean']:8.2f} {r['max/mean']:9.1f} "
            f"{r['>5x']:>4} {r['>20x']:>4}  {r['top']}" + (f"  {r['owl']:.4f}" if args.owl else "")
        )
    if args.ties:
        for key in ("wanda_rows_tied_at_cut", "magnitude_rows_tied_at_cut"):
            v = [r[key] for r in rows]
            print(f"{key}: mean {sum(v) / len(v):.2%} of rows, max {max(v):.2%}")
    if args.owl:
        by_block: dict[int, list[float]] = {}
        for r in rows:
            by_block.setdefault(r["block"], []).append(r["owl"])
        print(
            "owl ratio per block (mean over its layers, %):",
            " ".join(f"{100 * sum(v) / len(v):.2f}" for _, v in sorted(by_block.items())),
        )


if __name__ == "__main__":
    main()
