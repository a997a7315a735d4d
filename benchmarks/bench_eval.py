"""Throughput of `sparsetool eval` (a script, not a test).

  python benchmarks/bench_eval.py [--chars 60000] [--repeat 3] [--threads 1]

Models (random weights: throughput does not depend on what the weights say):
  - sparsetool's GPT, preset ``small`` (6 layers, width 256, context 256), bytes are tokens;
  - a small Hugging Face GPT-2 (4 layers, width 256, context 256) with a 4096-entry byte-level BPE
    tokenizer trained here on the same text.
Each is evaluated dense and after ``prune --sparsity 0.75`` (zeros and bitmask encodings). The
GPT-2 is also scored by a plain transformers loop on the same windows (``from_pretrained``, then
``model(ids, labels=ids)`` per window, batch 1), in the same run, and the two NLLs are compared.
Text: the first ``--chars`` characters of the held-out split of the built-in corpus. Runs are
interleaved and the best of ``--repeat`` is kept (the machine is shared). Work files go to
benchmarks/work/eval/ (git-ignored).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import time
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
WORK = Path(__file__).resolve().parent / "work" / "eval"


def build(text: str) -> dict[str, Path]:
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from sparsetool.models.gpt import GPT, PRESETS
    from sparsetool.ops.prune import PruneOptions, prune_checkpoint
    from sparsetool.train.runfiles import save_model

    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    torch.manual_seed(0)
    gpt = WORK / "gpt.safetensors"
    cfg = PRESETS["small"]
    save_model(gpt, GPT(cfg), {}, {"model": cfg.to_dict()})

    hf = WORK / "gpt2"
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        [text],
        trainers.BpeTrainer(
            vocab_size=4096,
            special_tokens=["<unk>", "<s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            n_layer=4,
            n_embd=256,
            n_head=4,
            vocab_size=4096,
            n_positions=256,
            bos_token_id=1,
            eos_token_id=1,
        )
    ).save_pretrained(hf)
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="<s>"
    ).save_pretrained(hf)
    out = {"gpt dense": gpt, "gpt2 dense": hf}
    for name, src in (("gpt", gpt), ("gpt2", hf)):
        for enc in ("zeros", "bitmask"):
            dst = WORK / (f"{name}-75-{enc}" + (".safetensors" if src.is_file() else ""))
            prune_checkpoint(src, dst, PruneOptions(sparsity=0.75, encoding=enc))
            out[f"{name} 75% {enc}"] = dst
    return out


def plain_loop(directory: Path, text: str, seq: int) -> tuple[float, int, float]:
    """(NLL per token, scored tokens, seconds): transformers alone, batch 1, same windows as
    eval."""
    import transformers

    from sparsetool.ops.eval import windows

    model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    ids = torch.tensor(transformers.AutoTokenizer.from_pretrained(directory)(text)["input_ids"])
    total, n = 0.0, 0
    t0 = time.perf_counter()
    with torch.inference_mode():
        for w in windows(len(ids), seq):
            x = ids[w.start : w.end][None]
            total += float(model(x, labels=x).loss) * w.scored
            n += w.scored
    return total / n, n, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chars", type=int, default=60_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)"
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from sparsetool.ops.eval import evaluate
    from sparsetool.util.corpus import load_corpus

    # the held-out split of the built-in corpus: what eval scores when given no text
    text = load_corpus(None).val.tobytes().decode("utf-8", errors="replace")[: args.chars]
    paths = build(text)
    best: dict[str, tuple[float, object]] = {}
    for _ in range(args.repeat):
        for name, path in paths.items():
            row = evaluate([path], text=text).rows[0]
            if name not in best or row.seconds < best[name][0]:
                best[name] = (row.seconds, row)
        nll, n, sec = plain_loop(paths["gpt2 dense"], text, 256)
        if "transformers loop" not in best or sec < best["transformers loop"][0]:
            best["transformers loop"] = (sec, (nll, n))

    print(
        f"- machine: {os.cpu_count()} cpus, {platform.machine()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; text: {len(text):,} chars of the held-out built-in "
        f"corpus; best of {args.repeat}"
    )
    print("\n| model | tokens scored | seconds | tokens/s | NLL |\n|---|---:|---:|---:|---:|")
    for name, (sec, row) in best.items():
        if name == "transformers loop":
            nll, n = row
            print(
                f"| gpt2 dense, plain transformers loop | {n:,} | {sec:.2f} | {n / sec:,.0f} | "
                f"{nll:.5f} |"
            )
        else:
            print(
                f"| {name} (sparsetool eval) | {row.tokens:,} | {sec:.2f} | "
                f"{row.tokens_per_s:,.0f} | {row.nll:.5f} |"
            )


if __name__ == "__main__":
    main()
