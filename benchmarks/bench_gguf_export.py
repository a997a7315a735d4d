"""convert DIR -o FILE.gguf on a real model: each --type's file size, time and peak RSS of the
export, and how close transformers' own GGUF reader of the file comes to the source directory's
next-token predictions on held-out text.

  python benchmarks/bench_gguf_export.py SMOLLM2 --heldout HELDOUT [--types f16,q8_0,q4_0]
                                         [--tokens 2048] [--work /tmp/bench-gguf]

For each type: ``sparsetool convert SMOLLM2 -o WORK/model.TYPE.gguf --type TYPE --json`` in its
own process (``measure.run_measured``: wall seconds, peak RSS), then both models score the same
windows of 256 held-out tokens in float32: top-1 agreement of the next-token predictions, and the
largest and mean absolute difference of the log-probabilities of the tokens that follow.
llama.cpp's own reading of the files is ``bench_llamacpp.py``'s (not here).

``--peer LLAMA_CPP --peer-python PY``: llama.cpp's own converter
(``LLAMA_CPP/convert_hf_to_gguf.py``, as the llama-cpp-python source distribution vendors it,
run by ``PY``, which has its needs:
torch, transformers, sentencepiece) on the same directory and types (f16, bf16, q8_0), each run
right after sparsetool's: wall time, peak RSS, and whether every tensor's bytes equal
sparsetool's file (the metadata keys that differ are listed).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from measure import machine, run_measured


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--heldout", type=Path, required=True)
    ap.add_argument("--types", default="f16,q8_0,q4_0")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench-gguf"))
    ap.add_argument("--peer", type=Path, help="a llama.cpp source tree (convert_hf_to_gguf.py)")
    ap.add_argument("--peer-python", help="the Python that runs the peer's converter")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    # The exports first, from a small process: a child forked from one holding the models would
    # count the parent's pages in its peak RSS.
    measured = {}
    peers: dict = {}
    for ty in args.types.split(","):
        out = args.work / f"model.{ty}.gguf"
        out.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "sparsetool", "convert", str(args.model), "-o", str(out)]
        m = run_measured([*cmd, "--type", ty, "--json"], cwd="/")
        if not m.ok:
            print(f"failed: {m.stderr[-400:]}")
            continue
        measured[ty] = (m, out.stat().st_size)
        if args.peer and args.peer_python and ty in ("f16", "bf16", "q8_0"):
            peers[ty] = _peer(args, ty)
    for ty, peer in peers.items():  # compared once every process is measured
        if peer is not None:
            _compare_peer(ty, args.work / f"model.{ty}.gguf", measured[ty][0], *peer)
    import torch
    import transformers as t

    tok = t.AutoTokenizer.from_pretrained(args.model)
    ids = tok(args.heldout.read_text())["input_ids"][: args.tokens // 256 * 256]
    windows = torch.tensor(ids).view(-1, 256)
    src = t.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()

    def logprobs(model) -> torch.Tensor:
        with torch.no_grad():
            return torch.cat([model(w[None], use_cache=False).logits[0].log_softmax(-1)
                              for w in windows])  # fmt: skip

    want = logprobs(src)
    keep = torch.ones(len(want), dtype=torch.bool)
    keep[255::256] = False  # the last position of each window has no next token here
    follow = windows[:, 1:].reshape(-1)
    print(f"# {time.strftime('%Y-%m-%d')}, {machine()}; {len(ids)} held-out tokens")
    print("| type | file MB | of f16 | export wall s | peak RSS MiB | top-1 agreement | "
          "max abs d logprob | mean abs d logprob |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for ty, (m, size) in measured.items():
        out = args.work / f"model.{ty}.gguf"
        model = t.AutoModelForCausalLM.from_pretrained(
            args.work, gguf_file=out.name, dtype=torch.float32
        ).eval()
        got = logprobs(model)
        agree = float((got.argmax(-1)[keep] == want.argmax(-1)[keep]).float().mean())
        pick = torch.arange(len(follow))
        d = (got[keep][pick, follow] - want[keep][pick, follow]).abs()
        f16 = measured.get("f16")
        ratio = size / f16[1] if f16 else float("nan")
        print(f"| {ty} | {size / 1e6:.1f} | {ratio:.3f} | {m.wall_s:.1f} | "
              f"{m.peak_rss_mib:,.0f} | {agree:.4f} | {float(d.max()):.3f} | "
              f"{float(d.mean()):.4f} |", flush=True)  # fmt: skip
        del model
        out.unlink()


def _peer(args, ty: str):
    """llama.cpp's converter on the same directory and type, right after sparsetool's run: its
    output and measurement (None if it failed)."""
    import os

    out = args.work / f"peer.{ty}.gguf"
    out.unlink(missing_ok=True)
    script = args.peer / "convert_hf_to_gguf.py"
    env = {**os.environ, "PYTHONPATH": f"{args.peer / 'gguf-py'}:{args.peer}"}
    cmd = [args.peer_python, str(script), str(args.model), "--outfile", str(out)]
    m = run_measured([*cmd, "--outtype", ty], cwd=str(args.peer), env=env)
    if not m.ok:
        print(f"peer {ty} failed: {m.stderr[-300:]}")
        return None
    return out, m


def _compare_peer(ty: str, ours: Path, mine, out: Path, m) -> None:
    """Whether every tensor of the two files has the same bytes; the metadata keys that differ."""
    import gguf
    import numpy as np

    a, b = gguf.GGUFReader(ours), gguf.GGUFReader(out)
    ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
    same = ta.keys() == tb.keys() and all(
        np.array_equal(np.asarray(ta[n].data), np.asarray(tb[n].data)) for n in ta
    )

    def value(reader, k):
        return reader.fields[k].contents() if k in reader.fields else None

    keys = sorted(
        k
        for k in set(a.fields) | set(b.fields)
        if not k.startswith("GGUF.") and value(a, k) != value(b, k)
    )
    print(f"<!-- {ty}: sparsetool {mine.wall_s:.1f} s {mine.peak_rss_mib:,.0f} MiB; "
          f"llama.cpp's converter {m.wall_s:.1f} s {m.peak_rss_mib:,.0f} MiB; "
          f"{len(ta)} tensors, {'every one equal' if same else 'some differ'}; "
          f"metadata that differs: {', '.join(keys) or 'none'} -->", flush=True)  # fmt: skip
    out.unlink()


if __name__ == "__main__":
    main()
