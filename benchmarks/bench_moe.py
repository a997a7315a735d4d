"""Mixture-of-Experts checkpoints at Qwen3-30B-A3B width: peak memory and time of magnitude, Wanda
and SparseGPT pruning and of eval, block by block, against depth.

  python benchmarks/bench_moe.py --workdir /tmp/sparsetool-moe [--layers 2,4]
                                 [--cases magnitude,wanda,sparsegpt,eval] [--samples 8] [--seq 256]
                                 [--keep]

Models: Qwen3-30B-A3B-shaped (``model_type`` qwen3_moe: d_model 2048, 32 query and 4 key/value
heads of 128, 128 experts of width 768 with 8 routed per token, router ``mlp.gate`` [128, 2048],
q/k norms, vocabulary 151936, untied head, bf16) with ``--layers`` blocks each, random weights
(normal, std 0.02; norms 1.0) so that the router spreads the tokens over the experts. Each expert is
stored as ``save_pretrained`` writes Qwen3-MoE: one 2-D tensor per expert and projection
(``model.layers.N.mlp.experts.E.gate_proj.weight`` ...), which transformers 5 merges into its fused
3-D parameters on loading. The files are written shard by shard (embeddings, one shard per block,
the head), one tensor in memory at a time. Before the first model is written, the tensor names
are checked against ``save_pretrained`` of a tiny Qwen3-MoE of the same layout, and the shapes
(merged as transformers merges them) against ``AutoModelForCausalLM.from_config`` of the full
config on the meta device. Each model gets the byte-level BPE tokenizer of ``bench_streamed.py``
(8,000 tokens, trained here) and the same calibration text (the first 400 KB of the built-in
corpus' training split).

Each command runs in its own process (``measure.run_measured``: wall seconds, peak RSS in MiB as
``/usr/bin/time -f %M`` / 1024), with ``--json``:

* ``prune MODEL -o OUT --sparsity 0.5`` (magnitude);
* ``prune ... --method wanda --calibration TEXT --samples N --seq T`` (float32 forward passes);
* the same with ``--method sparsegpt``;
* ``eval MODEL --text TEXT --seq 256 --max-tokens 2048``.

A table of wall time, peak RSS and the memory plan's estimate is printed, with the 4-block to
2-block RSS ratio per command (the largest depth over the smallest), then for each calibrated prune
the routed calibration tokens per expert matrix (``--json`` "experts") and how many matrices fell
back to magnitude (fewer than ``--expert-min-tokens``, default 32). Every result is also appended to
``WORKDIR/results.jsonl``. Outputs are deleted as soon as they are measured, the models at the end
(unless ``--keep``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import sys
import time
from pathlib import Path

from bench_streamed import calibration_text, tokenizer
from measure import machine, ram_gib, run_measured

REPO = Path(__file__).resolve().parent.parent
QWEN3_30B_A3B = dict(
    hidden_size=2048,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    moe_intermediate_size=768,
    intermediate_size=6144,
    num_experts=128,
    num_experts_per_tok=8,
    vocab_size=151936,
    tie_word_embeddings=False,
    norm_topk_prob=True,
    max_position_embeddings=4096,
)
TINY = dict(
    hidden_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    moe_intermediate_size=24,
    intermediate_size=64,
    num_experts=4,
    num_experts_per_tok=2,
    vocab_size=320,
    tie_word_embeddings=False,
    norm_topk_prob=True,
    max_position_embeddings=64,
)
NORMS = ("layernorm.weight", "q_norm.weight", "k_norm.weight", "model.norm.weight")


def shapes(c: dict, layers: int) -> dict[str, tuple[int, ...]]:
    """Every tensor of a Qwen3-MoE checkpoint as ``save_pretrained`` stores it (one tensor per
    expert), in model order."""
    d, e, f, hd = c["hidden_size"], c["num_experts"], c["moe_intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c["vocab_size"], d)}
    for i in range(layers):
        p = f"model.layers.{i}."
        out |= {
            p + "input_layernorm.weight": (d,),
            p + "post_attention_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (q, d),
            p + "self_attn.k_proj.weight": (kv, d),
            p + "self_attn.v_proj.weight": (kv, d),
            p + "self_attn.o_proj.weight": (d, q),
            p + "self_attn.q_norm.weight": (hd,),
            p + "self_attn.k_norm.weight": (hd,),
            p + "mlp.gate.weight": (e, d),
        }
        for x in range(e):
            out |= {
                p + f"mlp.experts.{x}.gate_proj.weight": (f, d),
                p + f"mlp.experts.{x}.up_proj.weight": (f, d),
                p + f"mlp.experts.{x}.down_proj.weight": (d, f),
            }
    out |= {"model.norm.weight": (d,), "lm_head.weight": (c["vocab_size"], d)}
    return out


def merged(stored: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The shapes transformers 5 runs: each block's experts stacked into ``experts.gate_up_proj``
    [E, 2F, D] (gate then up) and ``experts.down_proj`` [E, D, F]."""
    out: dict[str, tuple[int, ...]] = {}
    counts: dict[str, int] = {}
    for name, shape in stored.items():
        head, sep, tail = name.partition(".mlp.experts.")
        if not sep:
            out[name] = shape
            continue
        part = tail.split(".")[1]
        key = f"{head}.mlp.experts." + ("down_proj" if part == "down_proj" else "gate_up_proj")
        counts[key + part] = counts.get(key + part, 0) + 1
        rows = shape[0] * (1 if part == "down_proj" else 2)
        out[key] = (counts[key + part], rows, shape[1])
    return out


def config(c: dict, layers: int):
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        **c,
        num_hidden_layers=layers,
        bos_token_id=1,
        eos_token_id=1,
        dtype="bfloat16",
        architectures=["Qwen3MoeForCausalLM"],
    )


def verify(work: Path) -> None:
    """Stop unless the names are what ``save_pretrained`` writes and the shapes what the model
    holds."""
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    tiny = work / "tiny-qwen3-moe"
    shutil.rmtree(tiny, ignore_errors=True)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config(TINY, 2)).save_pretrained(tiny)
    with safe_open(str(tiny / "model.safetensors"), "pt") as f:
        saved = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    shutil.rmtree(tiny)
    ours = shapes(TINY, 2)
    if saved != ours:
        only_saved, only_ours = sorted(set(saved) - set(ours)), sorted(set(ours) - set(saved))
        other = [k for k in saved.keys() & ours.keys() if saved[k] != ours[k]]
        raise SystemExit(
            f"names/shapes differ from save_pretrained: only saved {only_saved[:5]}, "
            f"only ours {only_ours[:5]}, shapes {other[:5]}"
        )
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config(QWEN3_30B_A3B, 2))
    held = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    ours = merged(shapes(QWEN3_30B_A3B, 2))
    if held != ours:
        raise SystemExit(
            f"shapes differ from the model's: {sorted(set(held) ^ set(ours))[:5]} "
            f"{[k for k in held.keys() & ours.keys() if held[k] != ours[k]][:5]}"
        )
    print(
        f"# checked: {len(saved)} tensor names = save_pretrained's (tiny Qwen3-MoE, 2 blocks); "
        f"{len(held)} merged shapes = from_config's on the meta device (full width, 2 blocks)"
    )


def write_shard(path: Path, names: list[str], shape: dict[str, tuple[int, ...]], gen) -> int:
    """One safetensors file of bf16 tensors, one in memory at a time: norms 1.0, the rest normal
    with std 0.02."""
    import torch

    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in names:
        n = 2 * _numel(shape[name])
        header[name] = {
            "dtype": "BF16",
            "shape": list(shape[name]),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for name in names:
            if name.endswith(NORMS):
                t = torch.ones(shape[name], dtype=torch.bfloat16)
            else:
                t = (torch.randn(shape[name], generator=gen) * 0.02).to(torch.bfloat16)
            f.write(t.view(torch.uint8).numpy().tobytes())
    return offset


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def make_model(path: Path, layers: int, text: str) -> None:
    """The checkpoint at ``path``: the embeddings, each block and the head in shards of their own,
    an index, config.json and a tokenizer."""
    import torch

    gen = torch.Generator().manual_seed(0)
    shape = shapes(QWEN3_30B_A3B, layers)
    groups: list[list[str]] = [["model.embed_tokens.weight"]]
    groups += [[n for n in shape if n.startswith(f"model.layers.{i}.")] for i in range(layers)]
    groups.append(["model.norm.weight", "lm_head.weight"])
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    weight_map, size = {}, 0
    for i, group in enumerate(groups):
        shard = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        size += write_shard(tmp / shard, group, shape, gen)
        weight_map |= {name: shard for name in group}
    index = {"metadata": {"total_size": size}, "weight_map": dict(sorted(weight_map.items()))}
    (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config(QWEN3_30B_A3B, layers).save_pretrained(tmp)
    tokenizer(tmp, text)
    os.replace(tmp, path)


def run(cmd: list[str], env: dict) -> tuple[float, float, dict | None, str]:
    """(wall seconds, peak RSS in MiB, the --json output or None, the error line) of ``cmd``."""
    # Not from the source tree: `python -m` puts the working directory first on sys.path, ahead of
    # PYTHONPATH, and the code measured must be the one PYTHONPATH names.
    m = run_measured(cmd, env=env, cwd="/")
    if not m.ok:
        print(f"  failed ({m.returncode}): {' '.join(cmd)}\n  {m.stderr[-1500:]}", flush=True)
    return m.wall_s, m.peak_rss_mib, m.json(), m.error_line()


def experts_line(label: str, name: str, experts: dict) -> str:
    tokens = experts["routed_tokens"]
    counts = sorted(tokens.values())
    gate = [v for k, v in tokens.items() if k.endswith("gate_proj.weight")]
    return (
        f"- {label}, {name}: {len(counts)} expert matrices, routed tokens min {counts[0]}, "
        f"median {statistics.median(counts):.0f}, max {counts[-1]} (per expert, from "
        f"gate_proj: {len(gate)} experts, mean {statistics.mean(gate):.0f}, "
        f"stdev {statistics.pstdev(gate):.0f}, "
        f"{sum(v == 0 for v in gate)} routed none); by magnitude (< {experts['min_tokens']} "
        f"tokens): {len(experts['magnitude'])} matrices"
        + (f", first {experts['magnitude'][0]}" if experts["magnitude"] else "")
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/sparsetool-moe"))
    ap.add_argument("--layers", default="2,4")
    ap.add_argument("--cases", default="magnitude,wanda,sparsegpt,eval")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--keep", action="store_true", help="keep the models at the end")
    args = ap.parse_args()
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    text, calib = calibration_text(work)
    verify(work)
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, {machine()}, {ram_gib():.0f} GiB RAM", flush=True)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(REPO),
    }
    py = [sys.executable, "-m", "sparsetool"]
    sizes = [int(x) for x in args.layers.split(",") if x]
    wanted = args.cases.split(",")
    calibrated = [
        "--calibration",
        str(calib),
        "--samples",
        str(args.samples),
        "--seq",
        str(args.seq),
    ]
    rows: list[dict] = []
    notes: list[str] = []
    for layers in sizes:
        model = work / f"qwen3moe-{layers}L"
        if not model.exists():
            t0 = time.perf_counter()
            make_model(model, layers, text)
            print(f"# made {model} in {time.perf_counter() - t0:.0f} s", flush=True)
        size = sum(f.stat().st_size for f in model.iterdir()) / 1e9
        label = f"{layers} blocks ({size:.1f} GB)"
        out = work / "out"
        commands = {
            "magnitude": ["prune", str(model), "-o", str(out), "--sparsity", "0.5"],
            "wanda": [
                "prune",
                str(model),
                "-o",
                str(out),
                "--sparsity",
                "0.5",
                "--method",
                "wanda",
                *calibrated,
            ],
            "sparsegpt": [
                "prune",
                str(model),
                "-o",
                str(out),
                "--sparsity",
                "0.5",
                "--method",
                "sparsegpt",
                *calibrated,
            ],
            "eval": [
                "eval",
                str(model),
                "--text",
                str(calib),
                "--seq",
                "256",
                "--max-tokens",
                "2048",
            ],
        }
        for name in wanted:
            shutil.rmtree(out, ignore_errors=True)
            print(f"# {time.strftime('%H:%M:%S')} {label}: {' '.join(commands[name])}", flush=True)
            seconds, peak, result, error = run([*py, *commands[name], "--json"], env)
            shutil.rmtree(out, ignore_errors=True)
            memory = experts = None
            if result:
                first = (result.get("checkpoints") or [{}])[0]
                memory = result.get("memory") or first.get("memory")
                experts = result.get("experts")
            row = {
                "layers": layers,
                "label": label,
                "case": name,
                "seconds": seconds,
                "peak_mib": peak,
                "error": error,
                "plan_mib": memory and memory["peak_estimate"] / 2**20,
                "memory": memory,
                "experts": experts,
            }
            if name == "eval" and result:
                row["perplexity"] = result["checkpoints"][0].get("perplexity")
            with open(work / "results.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
            rows.append(row)
            plan = "-" if row["plan_mib"] is None else f"{row['plan_mib']:,.0f}"
            print(
                f"| {label} | {name} | {seconds:,.0f} | {peak:,.0f} | {plan} |"
                + (f" failed: {error}" if error else ""),
                flush=True,
            )
            if experts:
                notes.append(experts_line(label, name, experts))
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
                notes.append(f"- {label}, {name}: plan {MemoryPlan(**fields).describe()}")
        if not args.keep:
            shutil.rmtree(model)
    print("\n| model | command | wall s | peak RSS MiB | plan's estimate MiB |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        plan = "-" if r["plan_mib"] is None else f"{r['plan_mib']:,.0f}"
        print(
            f"| {r['label']} | {r['case']} | {r['seconds']:,.0f} | {r['peak_mib']:,.0f} | "
            f"{plan} |" + (f" failed: {r['error']}" if r["error"] else "")
        )
    if len(sizes) > 1:
        lo, hi = min(sizes), max(sizes)
        print(f"\n| command | peak RSS {hi}/{lo} blocks | wall {hi}/{lo} blocks |")
        print("|---|---:|---:|")
        for name in wanted:
            a = next((r for r in rows if r["layers"] == lo and r["case"] == name), None)
            b = next((r for r in rows if r["layers"] == hi and r["case"] == name), None)
            if a and b:
                print(
                    f"| {name} | {b['peak_mib'] / a['peak_mib']:.2f} | "
                    f"{b['seconds'] / a['seconds']:.2f} |"
                )
    print()
    print("\n".join(notes))


if __name__ == "__main__":
    main()
