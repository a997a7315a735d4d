"""``sparsetool shrink --experts``: what removing experts costs and takes, beside llm-compressor.

Two measurements:

  python benchmarks/bench_shrink.py quality MOE_DIR --heldout H.txt --calibration C.txt
      [--fractions 0.25,0.5] [--criteria reap,frequency,ean,random] [--samples 64] [--seq 256]
      [--limit 100] [--max-tokens 32768] [--peer-python /path/to/llmc-env/bin/python]
      [--work DIR] [--json OUT]

On a trained Mixture-of-Experts model (``benchmarks/make_moe.py``): for each fraction and
criterion, with and without ``--merge``, the shrink's wall time and peak RSS and the output's bytes
on disk; then one ``sparsetool eval`` of the dense model and every output over the held-out text
(perplexity, tokens/s) and, with ``--limit``, one over the seven standard tasks offline. With
``--peer-python``, llm-compressor's ``REAPPruningModifier`` (``benchmarks/peer_reap.py``, run in
that environment) on the same windows at each fraction: its time, peak RSS, perplexity and the
retained experts compared layer by layer with ``--criterion reap``.

  python benchmarks/bench_shrink.py depth --tokenizer DIR [--blocks 2,8] [--work DIR]

Peak RSS of ``shrink --experts 0.5 --criterion reap --dtype bfloat16`` on random models of
Qwen3-30B-A3B's width (hidden 2048, 128 experts of 768, top 8; bfloat16, experts fused on disk)
with each number of blocks: flat in depth when one block is in memory at a time. ``DIR`` gives
the tokenizer (any whose ids fit the vocabulary: the trained MoE's).

  python benchmarks/bench_shrink.py widths MODEL --heldout H.txt --calibration C.txt
      [--specs ffn=0.75/hidden=0.75/ffn=0.75,hidden=0.75] [--samples 32] [--seq 512]
      [--max-tokens 20000] [--threads 1] [--work DIR] [--json OUT]

On a dense model (the real-model benchmark's SmolLM2-135M): for each spec, ``shrink --ffn`` /
``--heads`` / ``--hidden`` (channels ranked by their activations; --ffn and --heads refit by least
squares), the same ranking sliced without the refit (``--no-reconstruct``, for --ffn and --heads)
and the same shapes kept by index (the first channels of every narrowed axis: the baseline the
ranking must beat); then one ``sparsetool eval``
per checkpoint over the held-out text (perplexity, tokens/s against the dense model's, parameters).

  python benchmarks/bench_shrink.py refit MODEL --heldout H.txt --calibration C.txt
      [--specs ffn=0.75/blocks=4] [--budgets 16x256/32x512/64x512] [--max-tokens 20000]
      [--threads 2] [--work DIR] [--json OUT]

Whether reconstruction ever makes a cut worse: for each spec and calibration budget (windows x
tokens), ``shrink`` with the refit (its damping chosen on held-back windows) and with
``--no-reconstruct`` on the same windows, then one ``sparsetool eval`` of the pair over the
held-out text (perplexity, paired against the plain cut); the refit's own held-back errors and
the layers it kept plain, from ``--json``.

  python benchmarks/bench_shrink.py params MODEL --heldout H.txt --calibration C.txt
      [--fractions 0.9/0.75/0.6] [--samples 32] [--seq 512] [--mixes "blocks=4,ffn=0.75"]
      [--max-tokens 20000] [--threads 2] [--work DIR] [--json OUT]

``shrink --params F`` for each fraction (its wall and CPU time, peak RSS, the candidates and the
choice, from ``--json``); then every candidate that met the budget made again as its own command
(``shrink --blocks/--ffn/...``), and the ``--mixes`` given by hand, and one ``sparsetool eval``
of the dense model, the chosen model and those over the held-out text (perplexity, paired
against dense). A search already in ``DIR/params-F.json`` is read, not run again.

Peak memory is the process's peak RSS (``measure.run_measured``: ``/usr/bin/time -f %M``'s
figure). Prints Markdown tables for RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from measure import machine, run_measured

ST = [sys.executable, "-m", "sparsetool"]
HERE = Path(__file__).resolve().parent


def shrink_cmd(src: Path, out: Path, args, fraction: float, criterion: str, merge: bool) -> list:
    cmd = [*ST, "shrink", str(src), "-o", str(out), "--experts", str(fraction), "--json", "-q"]
    cmd += ["--criterion", criterion, "--calibration", str(args.calibration)]
    cmd += ["--samples", str(args.samples), "--seq", str(args.seq)]
    return cmd + (["--merge"] if merge else [])


def quality(args) -> dict:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    src = Path(args.model)
    rows, outputs, kept = [], [src], {}
    for fraction in args.fractions:
        for criterion in args.criteria:
            for merge in (False, True):
                name = f"{criterion}-{int(fraction * 100)}{'-merge' if merge else ''}"
                out = work / name
                shutil.rmtree(out, ignore_errors=True)
                m = run_measured(shrink_cmd(src, out, args, fraction, criterion, merge))
                if not m.ok:
                    raise SystemExit(f"{name}: {m.error_line()}")
                got = m.json()
                kept[name] = [layer["kept"] for layer in got["layers"]]
                rows.append(
                    {
                        "name": name,
                        "tool": "sparsetool",
                        "fraction": fraction,
                        "criterion": criterion,
                        "merge": merge,
                        "wall_s": m.wall_s,
                        "peak_rss_mib": m.peak_rss_mib,
                        "bytes": got["bytes"]["after"],
                        "parameters": got["parameters"]["after"],
                    }
                )
                outputs.append(out)
                print(f"{name}: {m.wall_s:.1f} s, {m.peak_rss_mib:.0f} MiB", flush=True)
    if args.peer_python:
        for fraction in args.fractions:
            name = f"llmc-reap-{int(fraction * 100)}"
            out = work / name
            shutil.rmtree(out, ignore_errors=True)
            cmd = [args.peer_python, str(HERE / "peer_reap.py"), str(src), str(out)]
            cmd += ["--experts", str(fraction), "--calibration", str(args.calibration)]
            cmd += ["--samples", str(args.samples), "--seq", str(args.seq)]
            m = run_measured(cmd)
            if not m.ok:
                raise SystemExit(f"{name}: {m.error_line()}")
            got = json.loads(m.stdout.strip().splitlines()[-1])
            peer_kept = [sorted(v) for _, v in sorted(got["retained"].items(), key=_layer_key)]
            ours = kept[f"reap-{int(fraction * 100)}"]
            rows.append(
                {
                    "name": name,
                    "tool": "llm-compressor",
                    "fraction": fraction,
                    "criterion": "reap",
                    "merge": False,
                    "wall_s": m.wall_s,
                    "peak_rss_mib": m.peak_rss_mib,
                    "bytes": sum(f.stat().st_size for f in out.glob("*.safetensors")),
                    "oneshot_s": got["oneshot_s"],
                    "same_layers": sum(a == b for a, b in zip(ours, peer_kept)),
                    "layers": len(ours),
                    "differences": [
                        {"layer": i, "sparsetool": a, "llm-compressor": b}
                        for i, (a, b) in enumerate(zip(ours, peer_kept))
                        if a != b
                    ],
                }
            )
            outputs.append(out)
            print(f"{name}: {m.wall_s:.1f} s, {m.peak_rss_mib:.0f} MiB", flush=True)
    ev = run_measured(
        [*ST, "eval", *map(str, outputs), "--text", str(args.heldout), "--seq", str(args.seq)]
        + ["--max-tokens", str(args.max_tokens), "--json", "-q"]
    )
    if not ev.ok:
        raise SystemExit(f"eval: {ev.error_line()}")
    (work / "eval.json").write_text(ev.stdout)  # kept, should a later step fail
    by_name = {Path(c["name"]).name: c for c in ev.json()["checkpoints"]}
    dense = by_name[src.name]
    tasks = {}
    if args.limit:
        tv = run_measured(
            [*ST, "eval", *map(str, outputs), "--tasks", "zeroshot7", "--offline"]
            + ["--limit", str(args.limit), "--json", "-q"]
        )
        if not tv.ok:
            raise SystemExit(f"eval --tasks: {tv.error_line()}")
        for c in tv.json()["checkpoints"]:
            accs = {t: r.get("acc,none") for t, r in c["metrics"].items()}
            tasks[Path(c["name"]).name] = accs
    for r in [{"name": src.name, "tool": "dense", "bytes": _bytes(src)}] + rows:
        c = by_name[r["name"]]
        r["perplexity"] = c["perplexity"]
        r["tokens_per_s"] = c["tokens_per_s"]
        r["tasks"] = tasks.get(r["name"])
    record = {
        "machine": machine(),
        "command": " ".join(sys.argv),
        "dense": {
            "perplexity": dense["perplexity"],
            "tokens_per_s": dense["tokens_per_s"],
            "bytes": _bytes(src),
            "tasks": tasks.get(src.name),
        },
        "rows": rows,
    }
    print_quality(record)
    return record


def _layer_key(item) -> int:
    """llm-compressor names a layer ``model.layers.N.mlp``: its block number."""
    return int(next(p for p in item[0].split(".") if p.isdigit()))


def _bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.glob("*.safetensors"))


def print_quality(record: dict) -> None:
    dense = record["dense"]
    task_names = sorted(dense["tasks"] or {})
    head = ["model", "removed", "criterion", "merge", "perplexity", "time s", "peak RSS MiB"]
    head += ["MB on disk", "tokens/s"] + task_names + (["task mean"] if task_names else [])
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))

    def cells(r: dict, name: str, removed: str, crit: str, merge: str) -> list[str]:
        out = [name, removed, crit, merge, f"{r['perplexity']:.2f}"]
        out += [f"{r['wall_s']:.1f}" if "wall_s" in r else "-"]
        out += [f"{r['peak_rss_mib']:.0f}" if "peak_rss_mib" in r else "-"]
        out += [f"{r['bytes'] / 1e6:.1f}", f"{r['tokens_per_s']:.0f}"]
        accs = r.get("tasks") or {}
        out += [f"{accs[t]:.3f}" if accs.get(t) is not None else "-" for t in task_names]
        if task_names:
            vals = [accs[t] for t in task_names if accs.get(t) is not None]
            out += [f"{sum(vals) / len(vals):.3f}" if vals else "-"]
        return out

    print("| " + " | ".join(cells(dense, "dense", "0%", "-", "-")) + " |")
    for r in record["rows"]:
        name = r["tool"]
        merge = "yes" if r["merge"] else "no"
        print("| " + " | ".join(cells(r, name, f"{r['fraction']:.0%}", r["criterion"], merge)))
    for r in record["rows"]:
        if r["tool"] == "llm-compressor":
            print(
                f"\nllm-compressor REAP {r['fraction']:.0%}: retained experts equal to "
                f"sparsetool's --criterion reap in {r['same_layers']} of {r['layers']} layers"
            )
            for d in r["differences"]:
                print(f"  layer {d['layer']}: sparsetool {d['sparsetool']}, "
                      f"llm-compressor {d['llm-compressor']}")  # fmt: skip


def depth(args) -> dict:
    import torch
    import transformers as t

    from sparsetool.checkpoint.format import TensorSpec
    from sparsetool.checkpoint.writer import ShardWriter

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    text = work / "calib.txt"
    text.write_text(" ".join(["the experts of a mixture are routed by the gate"] * 400))
    rows = []
    for blocks in args.blocks:
        src = work / f"qwen3-30b-a3b-width-{blocks}"
        if not (src / "model.safetensors").exists():
            shutil.rmtree(src, ignore_errors=True)
            src.mkdir()
            config = t.Qwen3MoeConfig(
                hidden_size=2048, num_hidden_layers=blocks, num_attention_heads=32,
                num_key_value_heads=4, head_dim=128, moe_intermediate_size=768,
                intermediate_size=6144, num_experts=128, num_experts_per_tok=8,
                vocab_size=151936, max_position_embeddings=4096, dtype="bfloat16",
            )  # fmt: skip
            with torch.device("meta"):
                model = t.Qwen3MoeForCausalLM(config)
            shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
            specs = [TensorSpec(k, "BF16", s) for k, s in shapes.items()]
            g = torch.Generator().manual_seed(0)
            with ShardWriter(src / "model.safetensors", "model.safetensors", specs, None) as sw:
                for k, s in shapes.items():
                    if k.endswith("norm.weight"):
                        value = torch.ones(s, dtype=torch.bfloat16)
                    else:
                        value = (torch.randn(s, generator=g) * 0.02).to(torch.bfloat16)
                    sw.write(k, value)
                    del value
            config.save_pretrained(src)
            for f in Path(args.tokenizer).iterdir():
                if f.name.startswith(("tokenizer", "special_tokens")):
                    shutil.copy2(f, src / f.name)
        out = work / f"shrunk-{blocks}"
        shutil.rmtree(out, ignore_errors=True)
        cmd = [*ST, "shrink", str(src), "-o", str(out), "--experts", "0.5", "--json", "-q"]
        cmd += ["--calibration", str(text), "--samples", "4", "--seq", "128"]
        cmd += ["--dtype", "bfloat16"]
        m = run_measured(cmd)
        if not m.ok:
            raise SystemExit(f"depth {blocks}: {m.error_line()}")
        rows.append(
            {
                "blocks": blocks,
                "bytes_in": _bytes(src),
                "bytes_out": _bytes(out),
                "wall_s": m.wall_s,
                "peak_rss_mib": m.peak_rss_mib,
            }
        )
        shutil.rmtree(out)
        print(f"{blocks} blocks: {m.wall_s:.1f} s, {m.peak_rss_mib:.0f} MiB", flush=True)
    print("| blocks | input GB | output GB | time s | peak RSS MiB |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['blocks']} | {r['bytes_in'] / 1e9:.2f} | {r['bytes_out'] / 1e9:.2f} | "
            f"{r['wall_s']:.1f} | {r['peak_rss_mib']:.0f} |"
        )
    return {"machine": machine(), "command": " ".join(sys.argv), "rows": rows}


def by_index(dense: Path, ranked: Path, out: Path) -> None:
    """``ranked``'s shapes filled from ``dense`` by index: every axis it narrowed keeps the first
    entries (config, tokenizer and the rest copied from ``ranked``)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(ranked, out, ignore=shutil.ignore_patterns("*.safetensors"))
    tensors = {}
    with (
        safe_open(ranked / "model.safetensors", "pt") as r,
        safe_open(dense / "model.safetensors", "pt") as d,
    ):
        for name in r.keys():
            t = d.get_tensor(name)
            for axis, size in enumerate(r.get_slice(name).get_shape()):
                t = t.narrow(axis, 0, size)
            tensors[name] = t.contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def widths(args) -> dict:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    src = Path(args.model)

    def evaluate(ckpt: Path) -> dict:
        cmd = [*ST, "eval", str(ckpt), "--text", args.heldout, "--seq", "512", "--json", "-q"]
        cmd += ["--max-tokens", str(args.max_tokens), "--threads", str(args.threads)]
        m = run_measured(cmd)
        if not m.ok:
            raise SystemExit(f"eval {ckpt}: {m.error_line()}")
        row = json.loads(m.stdout)["checkpoints"][0]
        keys = ("perplexity", "params", "tokens", "tokens_per_s", "seconds")
        return {k: row[k] for k in keys} | {"bytes": _bytes(ckpt)}

    rows = [{"spec": "dense", "ranked": evaluate(src)}]
    print(f"dense: {rows[0]['ranked']}", flush=True)
    for spec in args.specs:
        flags = [f"--{kv.replace('=', ' ')}" for kv in spec.split(",")]
        name = spec.replace("=", "").replace(",", "-")
        out = work / name
        shutil.rmtree(out, ignore_errors=True)
        cmd = [*ST, "shrink", str(src), "-o", str(out), "--json", "-q"]
        cmd += [part for f in flags for part in f.split()]
        cmd += ["--calibration", args.calibration, "--samples", str(args.samples)]
        cmd += ["--seq", str(args.seq), "--threads", str(args.threads)]
        cmd += ["--multiple-of", "1"]  # round(F x width) as recorded (--hidden 0.75: 432)
        m = run_measured(cmd)
        if not m.ok:
            raise SystemExit(f"shrink {spec}: {m.error_line()}")
        index = work / f"{name}-index"
        by_index(src, out, index)
        row = {"spec": spec, "shrink_s": m.wall_s, "shrink_rss_mib": m.peak_rss_mib}
        row |= {"ranked": evaluate(out), "index": evaluate(index)}
        if any(kv.split("=")[0] in ("ffn", "heads") for kv in spec.split(",")):
            sliced = work / f"{name}-sliced"  # the same ranking's cut without the refit
            shutil.rmtree(sliced, ignore_errors=True)
            m = run_measured([*cmd[:6], str(sliced), *cmd[7:], "--no-reconstruct"])
            if not m.ok:
                raise SystemExit(f"shrink {spec} --no-reconstruct: {m.error_line()}")
            row |= {"sliced": evaluate(sliced), "sliced_shrink_s": m.wall_s}
            shutil.rmtree(sliced)
        rows.append(row)
        print(f"{spec}: {row}", flush=True)
        shutil.rmtree(out)
        shutil.rmtree(index)
    dense = rows[0]["ranked"]
    print(
        "| kept | parameters | ppl, ranked and refit | ppl, ranked, sliced (--no-reconstruct) | "
        "ppl, first by index | tokens/s vs dense | shrink s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    nan = float("nan")
    for r in rows:
        a, b, c = r["ranked"], r.get("index"), r.get("sliced")
        print(
            f"| {r['spec']} | {a['params'] / 1e6:.1f}M ({a['params'] / dense['params']:.2f}) | "
            f"{a['perplexity']:.2f} | {c['perplexity'] if c else nan:.2f} | "
            f"{b['perplexity'] if b else nan:.2f} | "
            f"{a['tokens_per_s'] / dense['tokens_per_s']:.2f}x | {r.get('shrink_s', 0):.0f} |"
        )
    return {"machine": machine(), "command": " ".join(sys.argv), "rows": rows}


def refit(args) -> dict:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    src = Path(args.model)

    def evaluate(*ckpts: Path) -> list[dict]:
        cmd = [*ST, "eval", *map(str, ckpts), "--text", args.heldout, "--seq", "512", "--json"]
        cmd += ["-q", "--max-tokens", str(args.max_tokens), "--threads", str(args.threads)]
        m = run_measured(cmd)
        if not m.ok:
            raise SystemExit(f"eval: {m.error_line()}")
        return json.loads(m.stdout)["checkpoints"]

    dense = evaluate(src)[0]["perplexity"]
    print(f"dense: {dense:.3f}", flush=True)
    rows = []
    for spec in args.specs:
        flag, value = spec.split("=")
        for budget in args.budgets:
            samples, seq = budget.split("x")
            made = {}
            for rec in (True, False):
                out = work / f"{flag}{value}-{budget}-{'refit' if rec else 'plain'}"
                shutil.rmtree(out, ignore_errors=True)
                cmd = [*ST, "shrink", str(src), "-o", str(out), f"--{flag}", value, "--json"]
                cmd += ["-q", "--calibration", args.calibration, "--samples", samples]
                cmd += ["--seq", seq, "--threads", str(args.threads)]
                m = run_measured(cmd + ([] if rec else ["--no-reconstruct"]))
                if not m.ok:
                    raise SystemExit(f"shrink {spec} {budget}: {m.error_line()}")
                made[rec] = (out, json.loads(m.stdout), m.wall_s)
            refit_row, plain_row = evaluate(made[True][0], made[False][0])
            rec_json = made[True][1]
            fit = (rec_json.get("widths") or {}).get("refit") or {}
            maps = ((rec_json.get("blocks") or {}).get("reconstruct") or {}).get("maps", [])
            row = {
                "spec": spec,
                "budget": budget,
                "dense": dense,
                "refit": refit_row["perplexity"],
                "plain": plain_row["perplexity"],
                "refit_shrink_s": made[True][2],
                "plain_shrink_s": made[False][2],
                "held_before": fit.get("held_before"),
                "held_after": fit.get("held_after"),
                "kept_plain": fit.get("layers_kept_plain"),
                "refit_layers": fit.get("layers_refit"),
                "maps": maps,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
            for out, _rec, _s in made.values():
                shutil.rmtree(out)
    print(
        "| cut | windows x tokens | plain | reconstructed | increase over dense, plain -> "
        "reconstructed | kept plain | shrink s (refit / plain) |"
    )
    print("|---|---|---:|---:|---:|---|---:|")
    for r in rows:
        up = (r["plain"] - r["dense"], r["refit"] - r["dense"])
        kept = (
            f"{r['kept_plain']} of {r['kept_plain'] + r['refit_layers']} projections"
            if r["kept_plain"] is not None
            else ", ".join(
                f"{m['run'][0]}-{m['run'][-1]}: {'kept plain' if m['kept_plain'] else 'mapped'}"
                for m in r["maps"]
            )
        )
        print(
            f"| --{r['spec'].replace('=', ' ')} | {r['budget']} | {r['plain']:.2f} | "
            f"{r['refit']:.2f} | {up[0]:.2f} -> {up[1]:.2f} ({up[1] / up[0] - 1:+.0%}) | {kept} | "
            f"{r['refit_shrink_s']:.0f} / {r['plain_shrink_s']:.0f} |"
        )
    return {"machine": machine(), "command": " ".join(sys.argv), "dense": dense, "rows": rows}


def params(args) -> dict:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    src = Path(args.model)
    calib = ["--calibration", args.calibration, "--samples", str(args.samples), "--seq"]
    calib += [str(args.seq), "--threads", str(args.threads), "--multiple-of", str(args.multiple_of)]
    rows = []
    for fraction in args.fractions:
        out = work / f"params-{fraction}"
        record = work / f"params-{fraction}.json"
        if record.exists() and out.exists():
            found = json.loads(record.read_text())
        else:
            shutil.rmtree(out, ignore_errors=True)
            cmd = [*ST, "shrink", str(src), "-o", str(out), "--params", fraction, "--json", *calib]
            m = run_measured(cmd)
            if not m.ok:
                raise SystemExit(f"shrink --params {fraction}: {m.error_line()}")
            found = {"result": json.loads(m.stdout), "wall_s": m.wall_s, "cpu_s": m.cpu_s,
                     "peak_rss_mib": m.peak_rss_mib}  # fmt: skip
            record.write_text(json.dumps(found, indent=1))
        search = found["result"]["search"]
        made = {"chosen: " + search["chosen"]: out}
        cuts = [c["cuts"] for c in search["candidates"] if c["meets_budget"]]
        cuts += [
            " ".join(f"--{kv.replace('=', ' ')}" for kv in mix.split(",")) for mix in args.mixes
        ]
        for i, cut in enumerate(dict.fromkeys(c for c in cuts if c != search["chosen"])):
            again = work / f"params-{fraction}-{i}"
            if not again.exists():
                cmd = [*ST, "shrink", str(src), "-o", str(again), *cut.split(), "-q", *calib]
                m = run_measured(cmd)
                if not m.ok:
                    raise SystemExit(f"shrink {cut}: {m.error_line()}")
            made[cut] = again
        cmd = [*ST, "eval", str(src), *map(str, made.values()), "--text", args.heldout, "--seq"]
        cmd += [str(args.eval_seq), "--json", "-q", "--max-tokens", str(args.max_tokens)]
        cmd += ["--threads"]
        m = run_measured(cmd + [str(args.threads)])
        if not m.ok:
            raise SystemExit(f"eval: {m.error_line()}")
        evals = json.loads(m.stdout)["checkpoints"]
        row = {"fraction": fraction, "search": search, "wall_s": found["wall_s"],
               "cpu_s": found["cpu_s"], "peak_rss_mib": found["peak_rss_mib"],
               "dense": evals[0]["perplexity"],
               "models": [{"cuts": k, "params": e["params"], "perplexity": e["perplexity"]}
                          for k, e in zip(made, evals[1:])]}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    for r in rows:
        print(f"\n--params {r['fraction']}: search {r['wall_s'] / 60:.1f} min wall, "
              f"{r['cpu_s'] / 60:.1f} min CPU, peak RSS {r['peak_rss_mib']:.0f} MiB; dense "
              f"{r['dense']:.2f}")  # fmt: skip
        print("| model | parameters | held-out perplexity |\n|---|---:|---:|")
        for mod in r["models"]:
            print(f"| {mod['cuts']} | {mod['params'] / 1e6:.1f}M | {mod['perplexity']:.2f} |")
        print(
            "| candidate | made as | parameters | predicted loss | loss |\n|---|---|---:|---:|---:|"
        )
        for c in r["search"]["candidates"]:
            pred = "" if c["predicted_loss"] is None else f"{c['predicted_loss']:.4f}"
            print(f"| {c['cuts']} | {c['role']} | {c['params'] / 1e6:.1f}M | {pred} | "
                  f"{c['loss']:.4f} |")  # fmt: skip
    return {"machine": machine(), "command": " ".join(sys.argv), "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    q = sub.add_parser("quality", help="criteria, merging and the peer on a trained MoE")
    q.add_argument("model")
    q.add_argument("--heldout", required=True)
    q.add_argument("--calibration", required=True)
    q.add_argument("--fractions", default="0.25,0.5")
    q.add_argument("--criteria", default="reap,frequency,ean,random")
    q.add_argument("--samples", type=int, default=64)
    q.add_argument("--seq", type=int, default=256)
    q.add_argument("--limit", type=int, default=0, help="documents per task (0: no tasks)")
    q.add_argument("--max-tokens", type=int, default=32768, help="held-out tokens scored")
    q.add_argument("--peer-python", help="python of an environment with llm-compressor 0.14")
    q.add_argument("--work", default="/tmp/bench-shrink")
    q.add_argument("--json", help="write the record here")
    w = sub.add_parser("widths", help="--ffn/--hidden ranked against by index, on a dense model")
    w.add_argument("model")
    w.add_argument("--heldout", required=True)
    w.add_argument("--calibration", required=True)
    w.add_argument("--specs", default="ffn=0.75/hidden=0.75/ffn=0.75,hidden=0.75")
    w.add_argument("--samples", type=int, default=32)
    w.add_argument("--seq", type=int, default=512)
    w.add_argument("--max-tokens", type=int, default=20000, help="held-out tokens scored")
    w.add_argument("--threads", type=int, default=1)
    w.add_argument("--work", default="/tmp/bench-shrink-widths")
    w.add_argument("--json", help="write the record here")
    r = sub.add_parser("refit", help="reconstructed against plain cuts at several budgets")
    r.add_argument("model")
    r.add_argument("--heldout", required=True)
    r.add_argument("--calibration", required=True)
    r.add_argument("--specs", default="ffn=0.75/blocks=4")
    r.add_argument("--budgets", default="16x256/32x512/64x512")
    r.add_argument("--max-tokens", type=int, default=20000, help="held-out tokens scored")
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--work", default="/tmp/bench-shrink-refit")
    r.add_argument("--json", help="write the record here")
    pa = sub.add_parser("params", help="shrink --params beside its candidates and hand mixes")
    pa.add_argument("model")
    pa.add_argument("--heldout", required=True)
    pa.add_argument("--calibration", required=True)
    pa.add_argument("--fractions", default="0.9/0.75/0.6")
    pa.add_argument("--mixes", default="", help="hand mixes, / between: blocks=4,ffn=0.75")
    pa.add_argument("--samples", type=int, default=32)
    pa.add_argument("--seq", type=int, default=512)
    pa.add_argument("--max-tokens", type=int, default=20000, help="held-out tokens scored")
    pa.add_argument("--threads", type=int, default=2)
    pa.add_argument("--multiple-of", type=int, default=32)
    pa.add_argument("--eval-seq", type=int, default=512, help="held-out window")
    pa.add_argument("--work", default="/tmp/bench-shrink-params")
    pa.add_argument("--json", help="write the record here")
    d = sub.add_parser("depth", help="peak RSS against depth at Qwen3-30B-A3B's width")
    d.add_argument("--tokenizer", required=True, help="a directory with tokenizer files")
    d.add_argument("--blocks", default="2,8")
    d.add_argument("--work", default="/tmp/bench-shrink-depth")
    d.add_argument("--json", help="write the record here")
    args = ap.parse_args()
    if args.what == "quality":
        args.fractions = [float(x) for x in args.fractions.split(",")]
        args.criteria = args.criteria.split(",")
        record = quality(args)
    elif args.what == "widths":
        args.specs = args.specs.split("/")
        record = widths(args)
    elif args.what == "params":
        args.fractions = args.fractions.split("/")
        args.mixes = [m for m in args.mixes.split("/") if m]
        record = params(args)
    elif args.what == "refit":
        args.specs, args.budgets = args.specs.split("/"), args.budgets.split("/")
        record = refit(args)
    else:
        args.blocks = [int(x) for x in args.blocks.split(",")]
        record = depth(args)
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
