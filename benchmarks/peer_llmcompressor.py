"""The peer of ``benchmarks/bench_real.py``: one Wanda or SparseGPT prune by llm-compressor.

  /path/to/llmc-env/bin/python benchmarks/peer_llmcompressor.py MODEL_DIR OUT_DIR
      --method wanda|sparsegpt (--sparsity S | --nm N:M) --calibration FILE
      [--samples 32] [--seq 512] [--seed 0] [--threads N]

Runs in an environment with llm-compressor (0.14) and sparsetool installed. Calibration uses
exactly the windows ``sparsetool prune`` uses: the text read as sparsetool reads it
(``sparsetool.ops.text.read_text``), encoded by the model's tokenizer as sparsetool encodes it (one
call on the whole text, the tokenizer's default special tokens), cut by
``sparsetool.ops.calibration.calibration_windows``, and handed to ``oneshot`` as a tokenized
``datasets.Dataset`` (``input_ids``, ``attention_mask``). The modifier is ``WandaPruningModifier``
or ``SparseGPTModifier`` with its defaults (SparseGPT: dampening 0.01, block size 128) apart from
sparsity, ``mask_structure`` ("0:0" unstructured; llm-compressor's "N:M" prunes N of every M,
so sparsetool's ``--nm 2:4``, keep 2 of 4, is its "2:4" too), ``targets=["Linear"]`` and
``ignore=["lm_head"]``. The model is saved uncompressed (float32 safetensors) with its tokenizer.

Prints one JSON line: seconds of loading, ``oneshot`` and saving, a digest of the windows, and the
sparsity of each saved tensor that has zeros (the embedding's shows whether the tied LM head was
pruned).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def windows(model: str, calibration: str, samples: int, seq: int, seed: int):
    """sparsetool's calibration windows for this model and text, as a (samples, seq) tensor."""
    from transformers import AutoTokenizer

    from sparsetool.ops.calibration import calibration_windows
    from sparsetool.ops.text import read_text

    tok = AutoTokenizer.from_pretrained(model, local_files_only=True)
    text = read_text(calibration, "--calibration")
    ids = list(tok(text)["input_ids"])
    return tok, calibration_windows(ids, samples, seq, seed, calibration)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--method", choices=("wanda", "sparsegpt"), required=True)
    ap.add_argument("--sparsity", type=float)
    ap.add_argument("--nm")
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int)
    ap.add_argument(
        "--owl",
        action="store_true",
        help="OWL's per-layer sparsity (sparsity_profile='owl', M 5, lambda 0.08)",
    )
    args = ap.parse_args()
    if (args.sparsity is None) == (args.nm is None):
        ap.error("give one of --sparsity or --nm")

    t0 = time.perf_counter()
    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.pruning import WandaPruningModifier
    from llmcompressor.modifiers.pruning.sparsegpt import SparseGPTModifier
    from transformers import AutoModelForCausalLM

    if args.threads:
        torch.set_num_threads(args.threads)
    tok, rows = windows(args.model, args.calibration, args.samples, args.seq, args.seed)
    digest = hashlib.sha256(rows.numpy().tobytes()).hexdigest()[:16]
    data = Dataset.from_dict(
        {"input_ids": rows.tolist(), "attention_mask": torch.ones_like(rows).tolist()}
    )
    if args.nm:
        n, m = (int(x) for x in args.nm.split(":"))
        sparsity, structure = 1 - n / m, f"{m - n}:{m}"  # llm-compressor counts the pruned ones
    else:
        sparsity, structure = args.sparsity, "0:0"
    cls = WandaPruningModifier if args.method == "wanda" else SparseGPTModifier
    owl = dict(sparsity_profile="owl", owl_m=5, owl_lmbda=0.08) if args.owl else {}
    if args.owl:
        let_owl_run_its_statistics_pass()
    # OWL allots one sparsity per target, so its targets are the decoder layers (their Linear
    # modules are pruned); with targets=["Linear"] it stops, one sparsity short per module.
    targets = [r"re:.*layers\.\d+$"] if args.owl else ["Linear"]
    modifier = cls(
        sparsity=sparsity, mask_structure=structure, targets=targets, ignore=["lm_head"], **owl
    )

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

    zeros = {}
    for name, p in model.state_dict().items():
        z = (p == 0).sum().item()
        if z:
            zeros[name] = z / p.numel()
    print(
        json.dumps(
            {
                "method": args.method,
                "sparsity": sparsity,
                "owl": args.owl,
                "mask_structure": structure,
                "windows_sha256": digest,
                "windows": list(rows.shape),
                "setup_s": t1 - t0,
                "load_s": t2 - t1,
                "oneshot_s": t3 - t2,
                "save_s": t4 - t3,
                "torch_threads": torch.get_num_threads(),
                "zero_fraction": zeros,
            }
        )
    )


def let_owl_run_its_statistics_pass() -> None:
    """Two faults stop ``sparsity_profile="owl"`` in llm-compressor 0.13 and 0.14, and both are
    worked around here, leaving the OWL arithmetic and the pruning llm-compressor's own:

    - it runs OWL's statistics pass through its calibration pipeline from inside the modifier's
      initialization, whose lifecycle events then fail ("Cannot invoke event before
      initializing"); the pass needs none of them (no modifier is initialized yet to hear them),
      so they are muted while it runs;
    - the per-layer sparsities come back as a dict, which the modifier then hands whole to every
      module as its sparsity (only a list is read per layer); they are handed over as a list, in
      the layers' order."""
    from llmcompressor.core.session_functions import LifecycleCallbacks
    from llmcompressor.modifiers.pruning.sparsegpt.sgpt_base import SparsityModifierBase

    original = SparsityModifierBase._get_activations
    events = ("calibration_start", "sequential_epoch_end", "calibration_end")

    def get_activations(self, *args, **kwargs):
        saved = {name: getattr(LifecycleCallbacks, name) for name in events}
        for name in events:
            setattr(LifecycleCallbacks, name, lambda *a, **k: None)
        try:
            return original(self, *args, **kwargs)
        finally:
            for name, event in saved.items():
                setattr(LifecycleCallbacks, name, event)

    SparsityModifierBase._get_activations = get_activations
    infer = SparsityModifierBase._infer_owl_layer_sparsity

    def owl_sparsities(self, *args, **kwargs):
        return list(infer(self, *args, **kwargs).values())

    SparsityModifierBase._infer_owl_layer_sparsity = owl_sparsities


if __name__ == "__main__":
    main()
