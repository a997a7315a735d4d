"""llama.cpp itself on what ``sparsetool convert DIR -o FILE.gguf`` writes: its next-token
predictions against transformers' on the source directories, and its speed, file size and peak
RSS, for dense, shrunk and pruned models side by side.

  python benchmarks/bench_llamacpp.py --model dense=SMOLLM2 --model ffn075=DIR ... \\
      --heldout HELDOUT [--types f16,q8_0,q4_0] [--tokens 256] [--gen 64] [--threads 1,2]
      [--repeat 5]

Needs llama-cpp-python (the ``llamacpp`` extra: a source distribution that compiles llama.cpp;
see the README). For each model and type: ``sparsetool convert DIR -o WORK/NAME.TYPE.gguf --type
TYPE``; then, each in its own process (``measure.run_measured``: wall time, peak RSS), llama.cpp
loads the file, evaluates ``--tokens`` held-out tokens in one batch (prompt tokens/s; its
log-probabilities of every next token saved) and generates ``--gen`` tokens greedily
(generation tokens/s, its 16-token prompt evaluated before the clock starts), with each of
``--threads``; ``--repeat`` rounds of all of them, one after the other (the speeds: the
medians, each model's runs spread over the whole benchmark). transformers
scores the same tokens from the directory in float32: top-1 agreement and the largest and mean
|difference| of the log-probabilities of the tokens that follow; and llama.cpp's tokenization of
the held-out text's first 3,000 characters against transformers' (tokens equal, position by
position). A pruned model is as large and as fast as the dense one in llama.cpp (GGUF holds it
dense): said in its row, not hidden.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from measure import machine, run_measured

CHILD = """
import json, statistics, sys, time
import numpy as np
import llama_cpp
path, ids_file, threads, gen, out, repeat, text_file = sys.argv[1:8]
ids = json.load(open(ids_file))
llm = llama_cpp.Llama(model_path=path, n_ctx=len(ids) + int(gen) + 8, n_batch=len(ids),
                      logits_all=True, verbose=False, n_threads=int(threads))
prompt, generated = [], []
for r in range(int(repeat)):
    llm.reset()
    t0 = time.perf_counter(); llm.eval(ids); prompt.append(len(ids) / (time.perf_counter() - t0))
    if r == 0:
        lg = np.array(llm.scores[: len(ids)], dtype=np.float64)
        m = lg.max(-1, keepdims=True)
        np.save(out, lg - m - np.log(np.exp(lg - m).sum(-1, keepdims=True)))
    llm.reset()
    llm.eval(ids[:16])  # the prompt, outside the generation's timing
    t0 = time.perf_counter(); n = 0
    for tok in llm.generate(ids[:16], temp=0.0, reset=False):
        n += 1
        if n >= int(gen):
            break
    generated.append(n / (time.perf_counter() - t0))
text = open(text_file, encoding="utf-8").read()[:3000]
tokens = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
print(json.dumps({"prompt_tok_s": statistics.median(prompt),
                  "gen_tok_s": statistics.median(generated), "tokens": tokens}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", required=True, help="NAME=DIR (repeat)")
    ap.add_argument("--heldout", type=Path, required=True)
    ap.add_argument("--types", default="f16,q8_0,q4_0")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--threads", default=f"1,{os.cpu_count()}")
    ap.add_argument("--repeat", type=int, default=1, help="rounds over every model, type and "
                    "threads, each run its own process; the speeds are their medians")  # fmt: skip
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench-llamacpp"))
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    models = [m.split("=", 1) for m in args.model]
    print(f"# {time.strftime('%Y-%m-%d')}, {machine()}; {args.tokens} held-out tokens scored, "
          f"{args.gen} generated; speeds the median of {args.repeat}")  # fmt: skip
    print("| model | type | file MB | threads | prompt tok/s | gen tok/s | peak RSS MiB | "
          "top-1 agreement | max abs d logprob | mean abs d logprob | "
          "tokens as transformers |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    # llama.cpp runs first, from this small process (a child forked from one holding a model
    # would count its pages in its own peak RSS); transformers' references after. The runs go
    # round-robin (every model and type once, then again): a box that slows during the run slows
    # every model alike, where model after model would charge the drift to the later ones.
    files = []
    for name, directory in models:
        ids = _held_out_ids(Path(directory), args.heldout, args.tokens)
        ids_file = args.work / f"{name}.ids.json"
        ids_file.write_text(json.dumps(ids))
        for ty in args.types.split(","):
            gguf = args.work / f"{name}.{ty}.gguf"
            gguf.unlink(missing_ok=True)
            cmd = [sys.executable, "-m", "sparsetool", "convert", directory, "-o", str(gguf)]
            m = run_measured([*cmd, "--type", ty, "-q"], cwd="/")
            if not m.ok:
                print(f"| {name} | {ty} | convert failed: {m.stderr.strip()[-200:]} |")
                continue
            files.append((name, directory, ty, gguf, ids_file))
    runs: dict[tuple, list] = {}
    for _ in range(args.repeat):
        for name, directory, ty, gguf, ids_file in files:
            for threads in args.threads.split(","):
                out = args.work / f"{name}.{ty}.{threads}.npy"
                child = [sys.executable, "-c", CHILD, str(gguf), str(ids_file), threads]
                extra = [str(args.gen), str(out), "1", str(args.heldout.resolve())]
                r = run_measured([*child, *extra], cwd="/")
                if not r.ok:
                    print(f"| {name} | {ty} | llama.cpp failed ({r.returncode}) | {threads} |")
                    continue
                speed = json.loads(r.stdout.strip().splitlines()[-1])
                runs.setdefault((name, directory, ty, gguf, threads, out), []).append(
                    (speed, r.peak_rss_mib)
                )
    rows = []
    for (name, directory, ty, gguf, threads, out), done in runs.items():
        speed = dict(done[0][0])
        for key in ("prompt_tok_s", "gen_tok_s"):
            speed[key] = statistics.median(s[key] for s, _ in done)
        rss = max(r for _, r in done)
        rows.append((name, directory, ty, gguf.stat().st_size, threads, speed, rss, out))
    for _name, _directory, _ty, gguf, _ids in files:
        gguf.unlink()
    wanted: dict[str, tuple] = {}
    for name, directory, ty, size, threads, speed, rss, out in rows:
        if name not in wanted:
            ids = json.loads((args.work / f"{name}.ids.json").read_text())
            try:
                wanted[name] = (ids, _reference(Path(directory), ids))
            except Exception as e:  # the speed stands; the agreement cannot be had
                wanted[name] = (ids, f"transformers cannot load it: {str(e).splitlines()[-1]}")
        ids, want = wanted[name]
        if isinstance(want, str):
            print(f"| {name} | {ty} | {size / 1e6:.1f} | {threads} | "
                  f"{speed['prompt_tok_s']:.1f} | {speed['gen_tok_s']:.1f} | {rss:,.0f} | "
                  f"{want} | | |", flush=True)  # fmt: skip
            continue
        agree, worst, mean = _compare(out, want, ids)
        theirs = _held_out_ids(Path(directory), args.heldout, None, chars=3000)
        same = sum(a == b for a, b in zip(speed["tokens"], theirs))
        tokens = f"{same} of {len(theirs)}" + ("" if len(speed["tokens"]) == len(theirs) else
                                                f" ({len(speed['tokens'])} there)")  # fmt: skip
        print(f"| {name} | {ty} | {size / 1e6:.1f} | {threads} | "
              f"{speed['prompt_tok_s']:.1f} | {speed['gen_tok_s']:.1f} | "
              f"{rss:,.0f} | {agree:.4f} | {worst:.3f} | {mean:.4f} | {tokens} |",
              flush=True)  # fmt: skip


def _held_out_ids(
    directory: Path, heldout: Path, tokens: int | None, chars: int | None = None
) -> list[int]:
    """The first ``tokens`` token ids of the held-out text (its first ``chars`` characters), by
    the directory's tokenizer (tokenizers only)."""
    from tokenizers import Tokenizer

    text = heldout.read_text(encoding="utf-8")[:chars]
    ids = Tokenizer.from_file(str(directory / "tokenizer.json")).encode(
        text, add_special_tokens=False
    )
    return ids.ids[:tokens]


def _reference(directory: Path, ids: list[int]):
    """transformers' log-probabilities (float32 model) of every next token of ``ids``."""
    import torch
    import transformers as t

    model = t.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids]), use_cache=False).logits[0]
    return logits.double().log_softmax(-1).numpy()


def _compare(out: Path, want, ids) -> tuple[float, float, float]:
    import numpy as np

    got = np.load(out)
    agree = float((got.argmax(-1) == want.argmax(-1)).mean())
    rows, nxt = np.arange(len(ids) - 1), np.array(ids[1:])
    d = np.abs(got[rows, nxt] - want[rows, nxt])
    return agree, float(d.max()), float(d.mean())


if __name__ == "__main__":
    main()
