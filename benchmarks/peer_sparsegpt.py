"""llm-compressor's SparseGPT on the same model and the same calibration windows as
``prune --method sparsegpt``, for a peak-memory and time comparison (run it in an environment that
has ``llmcompressor``, with sparsetool importable for the windows):

  /usr/bin/time -f "%e %M" python benchmarks/peer_sparsegpt.py MODEL_DIR CALIB.txt OUT_DIR \
      [--samples 8] [--seq 128] [--sparsity 0.5]

The windows are ``sparsetool.ops.calibration.calibration_windows`` of the text tokenized by the
model's own tokenizer, with sparsetool's default seed (0): the ones ``prune`` picks. The model is
loaded in its stored precision (``dtype="auto"``), as llm-compressor's examples do; its pruned
weights are saved to OUT_DIR (``prune`` writes its output too). The phases' seconds are printed.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("calibration", type=Path)
    ap.add_argument("output", type=Path)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--sparsity", type=float, default=0.5)
    args = ap.parse_args()
    t0 = time.perf_counter()
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.pruning import SparseGPTModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sparsetool.ops.calibration import calibration_windows

    tok = AutoTokenizer.from_pretrained(args.model)
    ids = list(tok(args.calibration.read_text())["input_ids"])
    windows = calibration_windows(ids, args.samples, args.seq, 0, str(args.calibration))
    data = Dataset.from_dict(
        {
            "input_ids": windows.tolist(),
            "attention_mask": [[1] * args.seq for _ in range(args.samples)],
        }
    )
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype="auto")
    t1 = time.perf_counter()
    # the decoder layers, one after the other, their linear layers pruned (the head left, as
    # prune leaves it)
    recipe = SparseGPTModifier(
        sparsity=args.sparsity,
        mask_structure="0:0",
        targets=[r"re:model.layers.\d+$"],
        ignore=["re:.*lm_head"],
    )
    oneshot(
        model=model,
        dataset=data,
        recipe=recipe,
        num_calibration_samples=args.samples,
        max_seq_length=args.seq,
        shuffle_calibration_samples=False,
    )
    t2 = time.perf_counter()
    model.save_pretrained(args.output)
    t3 = time.perf_counter()
    print(f"load {t1 - t0:.1f} s, oneshot {t2 - t1:.1f} s, save {t3 - t2:.1f} s")


if __name__ == "__main__":
    main()
