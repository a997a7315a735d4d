"""Model-level commands at 7B scale: peak memory and time of calibration pruning and eval, block by
block, against depth and (optionally) against an older sparsetool that loads the whole model.

  python benchmarks/bench_streamed.py --workdir /tmp/sparsetool-streamed [--layers 2,8,32]
                                      [--cases wanda,sparsegpt,eval] [--old SRC_DIR]
                                      [--samples 8] [--seq 128]

Models: Llama-2-7B-shaped (d_model 4096, FFN 11008, 32 heads, vocabulary 32000, bf16, random
weights; ``bench_checkpoint.make_checkpoint``) with ``--layers`` blocks each (32: the whole 13.5 GB
model, deleted after its runs). Each gets a byte-level BPE tokenizer trained here on the calibration
text (the first 400 KB of the built-in corpus' training split). For each model:

* ``prune --method wanda --sparsity 0.5 --calibration TEXT --samples N --seq T`` (float32 forward
  passes);
* ``wanda-last``: the same with ``--exclude`` leaving one tensor (the last block's attention output
  projection): every block is read and run, but the mask selection (Wanda's per-row kernel calls,
  ~14 s for an 11008 x 4096 layer on one core here) is done once instead of 224 times;
* ``prune --method sparsegpt ...`` (its solve of the 11008-wide down projection costs ~1.3 TFLOP
  a block on the CPU: minutes a block here);
* ``eval --text TEXT --max-tokens 2048 --seq 256``;
* ``shrink-ffn``, ``shrink-heads``, ``shrink-hidden``, ``shrink-blocks``: ``shrink --ffn 0.75``,
  ``--heads 0.5``, ``--hidden 0.75``, ``--blocks 2`` with their least-squares reconstruction
  (the down projection's 11008-wide ``X^T X`` in float64, 0.97 GB, is the largest thing a
  refit holds).

Each command runs in its own process (``measure.run_measured``); the wall time and the peak RSS
of that process in MiB (what ``/usr/bin/time -f %M`` reports, / 1024) are printed, with the memory
plan's estimate from ``--json`` (and the plan's own line). ``--old SRC_DIR`` runs the same commands
with ``PYTHONPATH=SRC_DIR`` (a checkout of an older sparsetool, e.g. one that builds the whole model
in float32) and compares the two prunes' outputs tensor by tensor (bytes). ``--peer-python PY``
also runs llm-compressor's SparseGPT (``peer_sparsegpt.py``, under an interpreter that has
llmcompressor) on the ``--peer-layers`` models. (This takes in what ``bench_sparsegpt_memory.py``
did: ``--cases sparsegpt --old SRC --peer-python PY``.)
Outputs are deleted as soon as they are measured (the disk holds one 7B at a time).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import struct
import sys
import time
from pathlib import Path

from bench_checkpoint import make_checkpoint
from measure import machine, ram_gib, run_measured

HERE = Path(__file__).resolve().parent


def tokenizer(directory: Path, text: str, vocab_size: int = 8000) -> None:
    """A byte-level BPE of ``vocab_size`` tokens trained on ``text``, saved in ``directory``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        [text],
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=["<unk>", "<s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="<s>"
    ).save_pretrained(directory)


def calibration_text(work: Path) -> tuple[str, Path]:
    """The calibration text (the first 400 KB of the built-in corpus' training split) and the
    file in ``work`` it is written to."""
    from sparsetool.util.corpus import load_corpus

    text = load_corpus(None).train[:400_000].tobytes().decode("utf-8", errors="replace")
    calib = work / "calib.txt"
    calib.write_text(text)
    return text, calib


def run(cmd: list[str], env: dict | None = None) -> tuple[float, float, dict | None]:
    """(wall seconds, peak RSS in MiB, the --json output or None)."""
    # Not from the source tree: `python -m` puts the working directory first on sys.path, ahead of
    # PYTHONPATH, and the code measured must be the one PYTHONPATH (or the install) names.
    m = run_measured(cmd, env=env, cwd="/")
    if not m.ok:
        print(f"  failed ({m.returncode}): {' '.join(cmd)}\n  {m.stderr[-600:]}")
    return m.wall_s, m.peak_rss_mib, m.json()


def digests(directory: Path) -> dict[str, str]:
    """Every stored tensor's SHA-256, read straight from the files (bf16 has no numpy type)."""
    table = {}
    for path in sorted(directory.glob("*.safetensors")):
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            for name, entry in header.items():
                if name != "__metadata__":
                    start, end = entry["data_offsets"]
                    f.seek(8 + n + start)
                    table[name] = hashlib.sha256(f.read(end - start)).hexdigest()
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/sparsetool-streamed"))
    ap.add_argument("--layers", default="2,8")
    ap.add_argument(
        "--cases",
        default="wanda,eval",
        help="of wanda, wanda-last, sparsegpt, eval, shrink-ffn, shrink-heads, shrink-hidden, "
        "shrink-blocks",
    )
    ap.add_argument("--old", type=Path, default=None, help="source checkout of an older sparsetool")
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of the runs")
    ap.add_argument(
        "--peer-python",
        default=None,
        help="a Python that has llmcompressor: runs peer_sparsegpt.py",
    )
    ap.add_argument("--peer-layers", default="2", help="the --layers the peer runs on")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    args = ap.parse_args()
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    text, calib = calibration_text(work)
    print(f"# {time.strftime('%Y-%m-%d')}, {machine()}, {ram_gib():.0f} GiB RAM")
    print("| model | command | code | wall s | peak RSS MiB | plan's estimate MiB |")
    print("|---|---|---|---:|---:|---:|")
    sizes = [int(x) for x in args.layers.split(",") if x]
    wanted = set(args.cases.split(","))
    base_env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    if args.threads:
        base_env["OMP_NUM_THREADS"] = str(args.threads)
    for layers in sizes:
        model = work / f"llama7b-{layers}L"
        if not model.exists():
            make_checkpoint(model, layers=layers, shape="llama7b", shards=max(1, layers // 11))
            tokenizer(model, text)
        size = sum(f.stat().st_size for f in model.iterdir()) / 1e9
        label = f"Llama-7B-shaped, {layers} blocks ({size:.1f} GB bf16)"
        prune = [
            "prune",
            str(model),
            "--sparsity",
            "0.5",
            "--calibration",
            str(calib),
            "--samples",
            str(args.samples),
            "--seq",
            str(args.seq),
        ]
        evaluate = [
            "eval",
            str(model),
            "--text",
            str(calib),
            "--max-tokens",
            "2048",
            "--seq",
            "256",
        ]
        shrink = ["shrink", str(model), "--calibration", str(calib)]
        shrink += ["--samples", str(args.samples), "--seq", str(args.seq)]
        last = [f"--exclude=model.layers.{i}.*" for i in range(layers - 1)]
        last += [f"--exclude=*{x}*" for x in ("mlp", "q_proj", "k_proj", "v_proj")]
        cases = [
            (name, cmd)
            for key, name, cmd in (
                ("wanda", "prune --method wanda", prune + ["--method", "wanda"]),
                (
                    "wanda-last",
                    "prune --method wanda, last block's o_proj only",
                    prune + ["--method", "wanda", *last],
                ),
                ("sparsegpt", "prune --method sparsegpt", prune + ["--method", "sparsegpt"]),
                ("eval", "eval", evaluate),
                ("shrink-ffn", "shrink --ffn 0.75 (refit)", shrink + ["--ffn", "0.75"]),
                ("shrink-heads", "shrink --heads 0.5 (refit)", shrink + ["--heads", "0.5"]),
                ("shrink-hidden", "shrink --hidden 0.75 (refit)", shrink + ["--hidden", "0.75"]),
                # two blocks: bi removes block 0 of these random models first, which has no block
                # before it to fold a map into; the second gets one (at least 3 blocks)
                ("shrink-blocks", "shrink --blocks 2 (ReplaceMe)", shrink + ["--blocks", "2"]),
            )
            if key in wanted
        ]
        codes = [("this", base_env)]
        if args.old:
            codes.append(("old", {**base_env, "PYTHONPATH": str(args.old)}))
        for name, cmd in cases:
            outs = {}
            for code, env in codes:
                out = work / f"out-{code}"
                shutil.rmtree(out, ignore_errors=True)
                full = [sys.executable, "-m", "sparsetool", *cmd[:2]]
                full += ["-o", str(out)] if cmd[0] in ("prune", "shrink") else []
                full += [*cmd[2:], "--json"]
                seconds, peak, result = run(full, env)
                outs[code] = out
                plan = None
                if result:
                    memory = result.get("memory") or (result.get("checkpoints") or [{}])[0].get(
                        "memory"
                    )
                    plan = memory and memory["peak_estimate"] / 2**20
                    if memory:
                        from sparsetool.util.memory import MemoryPlan

                        fields = {
                            k: memory[k]
                            for k in (
                                "fixed",
                                "weights",
                                "activations",
                                "statistics",
                                "budget",
                                "budget_source",
                            )
                        }
                        print(f"<!-- {label}, {name}: {MemoryPlan(**fields).describe()} -->")
                print(
                    f"| {label} | {name} | {code} | {seconds:.0f} | {peak:,.0f} | "
                    f"{'-' if plan is None else f'{plan:,.0f}'} |",
                    flush=True,
                )
            if len(outs) == 2 and all(o.is_dir() for o in outs.values()):
                a, b = digests(outs["this"]), digests(outs["old"])
                differ = sorted(n for n in a if a[n] != b.get(n))
                print(f"<!-- {label}, {name}: {len(a)} tensors compared, {len(differ)} differ -->")
            for out in outs.values():
                shutil.rmtree(out, ignore_errors=True)
        if args.peer_python and str(layers) in args.peer_layers.split(","):
            out = work / "out-peer"
            peer = [args.peer_python, str(HERE / "peer_sparsegpt.py"), str(model), str(calib)]
            peer += [str(out), "--samples", str(args.samples), "--seq", str(args.seq)]
            seconds, peak, _ = run(peer, {**base_env, "PYTHONPATH": str(HERE.parent)})
            print(
                f"| {label} | llm-compressor SparseGPT | peer | {seconds:.0f} | {peak:,.0f} | - |"
            )
            shutil.rmtree(out, ignore_errors=True)
        if layers >= 16:  # the disk holds one 7B at a time
            shutil.rmtree(model)


if __name__ == "__main__":
    main()
