"""The peer of ``benchmarks/bench_shrink.py``: llm-compressor's REAP expert pruning of one model.

  /path/to/llmc-env/bin/python benchmarks/peer_reap.py MODEL_DIR OUT_DIR --experts F
      --calibration FILE [--samples 64] [--seq 256] [--seed 0] [--threads N]

Runs in an environment with llm-compressor (0.14.0.1) and sparsetool installed. Calibration uses
exactly the windows ``sparsetool shrink`` uses (the text read by ``sparsetool.ops.text.read_text``,
encoded in one call by the model's tokenizer, cut by
``sparsetool.ops.calibration.calibration_windows``), handed to ``oneshot`` as a tokenized
``datasets.Dataset``. The modifier is ``REAPPruningModifier(sparsity=F)`` with its defaults; its
report of the retained experts per layer is printed. The model is saved as float32 safetensors
with its tokenizer.

Prints one JSON line: seconds of loading, ``oneshot`` and saving, a digest of the windows, and the
retained experts of each layer.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--experts", type=float, required=True, help="fraction of experts removed")
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int)
    args = ap.parse_args()

    t0 = time.perf_counter()
    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.pruning.reap import REAPPruningModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sparsetool.ops.calibration import calibration_windows
    from sparsetool.ops.text import read_text

    if args.threads:
        torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    ids = list(tok(read_text(args.calibration, "--calibration"))["input_ids"])
    rows = calibration_windows(ids, args.samples, args.seq, args.seed, args.calibration)
    digest = hashlib.sha256(rows.numpy().tobytes()).hexdigest()[:16]
    data = Dataset.from_dict(
        {"input_ids": rows.tolist(), "attention_mask": torch.ones_like(rows).tolist()}
    )
    report = Path(tempfile.mkdtemp()) / "retained.json"
    modifier = REAPPruningModifier(sparsity=args.experts, report_path=str(report))

    t1 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        args.model, dtype=torch.float32, local_files_only=True
    )
    t2 = time.perf_counter()
    oneshot(
        model=model,
        dataset=data,
        recipe=modifier,
        num_calibration_samples=args.samples,
        max_seq_length=args.seq,
        shuffle_calibration_samples=False,
    )
    t3 = time.perf_counter()
    tmp = Path(args.out + ".partial")  # the output appears only when complete
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp), save_compressed=False)
    tok.save_pretrained(str(tmp))
    tmp.rename(args.out)
    t4 = time.perf_counter()
    retained = json.loads(report.read_text())
    print(
        json.dumps(
            {
                "experts": args.experts,
                "windows_sha256": digest,
                "windows": list(rows.shape),
                "setup_s": t1 - t0,
                "load_s": t2 - t1,
                "oneshot_s": t3 - t2,
                "save_s": t4 - t3,
                "torch_threads": torch.get_num_threads(),
                "retained": retained,
            }
        )
    )


if __name__ == "__main__":
    main()
