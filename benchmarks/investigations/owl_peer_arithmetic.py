"""OWL with llm-compressor's arithmetic, in sparsetool's pruning (a script, not a test).

  python benchmarks/investigations/owl_peer_arithmetic.py MODEL OUT --calibration FILE
      [--stat ours|peer] [--floor ours|peer] [--sparsity 0.7] [--samples 32] [--seq 512]
      [--seed 0] [--threads 1]

Prunes MODEL (a Llama-family Hugging Face directory) with Wanda and ``--allocation owl``, as
``sparsetool prune`` does, except for the two places where llm-compressor's OWL (0.14) computes
differently, each switched on its own:

- ``--stat peer``: a block's outlier ratio from each input feature's norm as llm-compressor sums
  it, the sum over calibration windows of the window's L2 norm, instead of sparsetool's root of
  the sum of squares over every token (the Wanda score's own norm);
- ``--floor peer``: each row of a block's tensors prunes ``floor(cols * s_block)`` weights
  (llm-compressor's rule; it keeps slightly more than the target), instead of sparsetool's exact
  counts that add up to the target.

The pruning pass after the allocation is sparsetool's, unchanged. Writes OUT and OUT.owl.json
(each block's outlier ratio and sparsity); score OUT with ``sparsetool eval OUT --text HELDOUT
--seq 512 --max-tokens 20K``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[2].strip())
    ap.add_argument("model", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--stat", choices=("ours", "peer"), default="ours")
    ap.add_argument("--floor", choices=("ours", "peer"), default="ours")
    ap.add_argument("--sparsity", type=float, default=0.7)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    import torch

    import sparsetool.ops.prune.owl_pass as owl_pass
    from sparsetool.ops.prune import PruneOptions, prune_checkpoint

    torch.set_num_threads(args.threads)
    record: dict = {"stat": args.stat, "floor": args.floor}
    gather, sparsities = owl_pass.gather_statistics, owl_pass.owl_sparsities

    if args.stat == "peer":

        def peer_gather(model, i, layers, calls, placement, **kw):
            """Each input's statistics window by window: the sum of the windows' norms, squared
            (the Wanda score takes its root)."""
            norms: dict[str, torch.Tensor] = {}
            last = None
            for call in calls:
                last = gather(model, i, layers, [call], placement, **kw)
                for key in layers:
                    n = last.of(key).sq.sqrt()
                    norms[key] = n if key not in norms else norms[key] + n
            assert last is not None
            for key in layers:
                last.of(key).sq = norms[key] ** 2
            return last

        owl_pass.gather_statistics = peer_gather

    def recorded(ratios, sizes, sparsity, lam):
        out = sparsities(ratios, sizes, sparsity, lam)
        record["ratios"], record["sparsities"] = list(ratios), list(out)
        return out

    owl_pass.owl_sparsities = recorded
    if args.floor == "peer":
        from safetensors import safe_open

        shapes = {}
        for f in sorted(args.model.glob("*.safetensors")):
            with safe_open(str(f), "pt") as st:
                shapes.update({k: tuple(st.get_slice(k).get_shape()) for k in st.keys()})

        def floored(blocks, block_sparsities, sparsity):
            keep = {}
            for block, s in zip(blocks, block_sparsities):
                for name in block:
                    rows, cols = shapes[name]
                    keep[name] = rows * (cols - int(cols * s))
            return keep

        owl_pass.owl_keep = floored

    t = time.time()
    prune_checkpoint(
        args.model,
        args.out,
        PruneOptions(
            method="wanda",
            sparsity=args.sparsity,
            calibration=args.calibration,
            samples=args.samples,
            seq=args.seq,
            seed=args.seed,
            allocation="owl",
            device="cpu",
        ),
    )
    record["seconds"] = time.time() - t
    Path(f"{args.out}.owl.json").write_text(json.dumps(record, indent=1))
    print(f"wrote {args.out} in {record['seconds']:.0f} s")


if __name__ == "__main__":
    main()
