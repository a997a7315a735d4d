"""Checkpoint-engine benchmark: prune / densify / report against `cp`, at 1.3B and 7B scale.

Makes a checkpoint of random bf16 weights, then times each command in one run on the same warm
page cache, as a new user would run it:

* ``--shape gpt3xl`` (default): GPT-3-XL-shaped (24 layers, d_model 2048, FFN 8192, vocab 50257,
  GPT-2 tensor names), one file, about 2.6 GB;
* ``--shape llama7b``: Llama-2-7B-shaped (32 layers, d_model 4096, FFN 11008, vocab 32000, Llama
  tensor names), a Hugging Face directory of 3 shards with an index and config.json, about
  13.5 GB.

Cases: ``cp`` (``cp -r`` for a directory: the baseline every ratio is relative to), ``python -c
"import torch"`` (the start-up floor of a command that needs torch), ``sparsetool prune`` (layer
and global scope, 0.75), ``densify`` (of the layer-pruned output) and ``report``, and optionally a
naive load_file / kthvalue / save_file script (``--naive``, 1.3B only).

Every run starts equal: earlier outputs deleted and ``sync`` run first (untimed). One run gives
two wall times: until the command exits ("no sync": the page cache absorbed the write, as on a
fast disk), and until a ``sync`` after it returns ("sync": the data on disk). Peak RSS (MiB) comes
from ``measure.run_measured`` (``os.wait4``: ``/usr/bin/time -f %M`` / 1024). Each case runs
``--repeat`` times; the best of each time is kept (a shared, noisy machine). The checkpoint is
made in a child process so that its memory is not inherited by the timed commands (peak RSS
survives ``fork`` and ``exec``).

    python benchmarks/bench_checkpoint.py --workdir /tmp/sparsetool-bench [--shape llama7b]
        [--repeat 2] [--workers N]
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

from measure import machine, run_measured

NAIVE = r"""
import sys, torch
from safetensors.torch import load_file, save_file
state = load_file(sys.argv[1])
for name, w in state.items():
    if name.endswith(
        ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    ):
        k = round(0.75 * w.numel())
        thr = w.abs().float().flatten().kthvalue(k).values
        state[name] = torch.where(w.abs().float() > thr, w, torch.zeros_like(w))
save_file(state, sys.argv[2], metadata={"format": "pt"})
"""

# The targets: (ratio to cp with sync, ratio without sync or None); peak RSS separately; and the
# start-up cases (--help, a usage error) in seconds.
TARGETS = {
    "prune --scope layer": (1.5, 2.5),
    "prune --scope global": (2.0, None),
    "densify": (1.2, None),
    "report": (0.3, None),
}
STARTUP_TARGET = 0.3
BUSY = "import time\nend = time.time() + 3600\nwhile time.time() < end:\n    pass\n"


def gpt3xl_shapes(
    layers: int = 24, d: int = 2048, ffn: int = 8192, vocab: int = 50257, ctx: int = 2048
) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {
        "transformer.wte.weight": (vocab, d),
        "transformer.wpe.weight": (ctx, d),
    }
    for i in range(layers):
        p = f"transformer.h.{i}."
        shapes |= {
            p + "ln_1.weight": (d,),
            p + "ln_1.bias": (d,),
            p + "attn.c_attn.weight": (d, 3 * d),
            p + "attn.c_attn.bias": (3 * d,),
            p + "attn.c_proj.weight": (d, d),
            p + "attn.c_proj.bias": (d,),
            p + "ln_2.weight": (d,),
            p + "ln_2.bias": (d,),
            p + "mlp.c_fc.weight": (d, ffn),
            p + "mlp.c_fc.bias": (ffn,),
            p + "mlp.c_proj.weight": (ffn, d),
            p + "mlp.c_proj.bias": (d,),
        }
    shapes |= {"transformer.ln_f.weight": (d,), "transformer.ln_f.bias": (d,)}
    return shapes


def llama_shapes(
    layers: int = 32, d: int = 4096, ffn: int = 11008, vocab: int = 32000
) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, d)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,)}
        shapes |= {p + f"self_attn.{x}_proj.weight": (d, d) for x in "qkvo"}
        shapes |= {
            p + "mlp.gate_proj.weight": (ffn, d),
            p + "mlp.up_proj.weight": (ffn, d),
            p + "mlp.down_proj.weight": (d, ffn),
        }
    shapes |= {"model.norm.weight": (d,), "lm_head.weight": (vocab, d)}
    return shapes


LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def write_file(path: Path, names: list[str], shapes: dict[str, tuple[int, ...]], gen) -> int:
    """One safetensors file of random bf16 tensors, streamed (one tensor in memory at a time)."""
    import torch

    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in sorted(names):
        n = 2 * _numel(shapes[name])
        header[name] = {
            "dtype": "BF16",
            "shape": list(shapes[name]),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for name in sorted(names):
            t = (torch.randn(shapes[name], generator=gen) * 0.02).to(torch.bfloat16)
            f.write(t.view(torch.uint8).numpy().tobytes())
    return offset


def make_checkpoint(path: Path, layers: int = 24, shape: str = "gpt3xl", shards: int = 3) -> None:
    """The benchmark checkpoint at ``path``: one file (gpt3xl) or a sharded directory (llama7b)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    if shape == "gpt3xl":
        shapes = gpt3xl_shapes(layers)
        write_file(path, list(shapes), shapes, gen)
        return
    shapes = llama_shapes(layers)
    names = list(shapes)  # model order: embeddings, layer by layer, head
    total = sum(2 * _numel(s) for s in shapes.values())
    groups: list[list[str]] = [[] for _ in range(shards)]
    done = 0
    for name in names:  # fill shard after shard to about the same size
        groups[min(shards - 1, done * shards // total)].append(name)
        done += 2 * _numel(shapes[name])
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    weight_map, size = {}, 0
    for i, group in enumerate(groups):
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        size += write_file(tmp / shard, group, shapes, gen)
        weight_map |= {name: shard for name in group}
    (tmp / "model.safetensors.index.json").write_text(
        json.dumps(
            {"metadata": {"total_size": size}, "weight_map": dict(sorted(weight_map.items()))},
            indent=2,
        )
    )
    (tmp / "config.json").write_text(
        json.dumps({**LLAMA_CONFIG, "num_hidden_layers": layers}, indent=2)
    )
    os.replace(tmp, path)


def _size(p: Path) -> int:
    return (
        sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        if p.is_dir()
        else p.stat().st_size
    )


def _remove(p: Path) -> None:
    if p.is_dir():
        shutil.rmtree(p)
    elif p.exists():
        p.unlink()


SETTLE = 3.0


def timed(
    cmd: list[str], clear: list[Path], env: dict | None = None, expect: int = 0
) -> tuple[float, float, float]:
    """(wall seconds until exit, wall seconds until a ``sync`` after it, peak RSS in MiB)."""
    for p in clear:
        _remove(p)
    os.sync()
    time.sleep(SETTLE)  # this disk is mounted with discard: let the freed blocks' trims finish
    m = run_measured(cmd, env=None if env is None else {**os.environ, **env})
    os.sync()
    synced = m.seconds_since_start()
    if m.returncode != expect:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{m.stderr}")
    return m.wall_s, synced, m.peak_rss_mib


def same_output(a: Path, b: Path) -> bool:
    if a.is_dir():
        names = sorted(p.name for p in a.iterdir())
        return names == sorted(p.name for p in b.iterdir()) and all(
            filecmp.cmp(a / n, b / n, shallow=False) for n in names
        )
    return filecmp.cmp(a, b, shallow=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/sparsetool-bench"))
    ap.add_argument("--shape", choices=("gpt3xl", "llama7b"), default="gpt3xl")
    ap.add_argument("--layers", type=int, default=None, help="default 24 (gpt3xl) or 32 (llama7b)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--workers", type=int, default=None, help="pass --workers N to sparsetool")
    ap.add_argument("--naive", action="store_true", help="also time the naive script (gpt3xl)")
    ap.add_argument(
        "--check-workers",
        action="store_true",
        help="also prune with --workers 1 and compare the output bytes",
    )
    ap.add_argument(
        "--busy",
        action="store_true",
        help="run one other CPU-bound process (a Python busy loop) during every case",
    )
    ap.add_argument(
        "--old",
        type=Path,
        default=None,
        help="also time prune of the sparsetool source tree in this directory (e.g. a "
        "git worktree of an earlier commit), in the same run",
    )
    ap.add_argument(
        "--make", type=Path, help=argparse.SUPPRESS
    )  # the child that makes the checkpoint
    args = ap.parse_args()
    layers = args.layers or (24 if args.shape == "gpt3xl" else 32)
    if args.make:
        make_checkpoint(args.make, layers, args.shape)
        return
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    ext = ".safetensors" if args.shape == "gpt3xl" else ""
    src = work / f"{args.shape}-{layers}{ext}"
    if not src.exists():
        print(f"making {src} ...", flush=True)
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--shape",
                args.shape,
                "--layers",
                str(layers),
                "--make",
                str(src),
            ],
            check=True,
        )
    size = _size(src)
    st = [sys.executable, "-m", "sparsetool"]
    extra = ["--workers", str(args.workers)] if args.workers else []
    out = {
        k: work / f"out-{k}{ext}"
        for k in ("copy", "layer", "global", "dense", "naive", "one", "old")
    }
    pruned = work / f"pruned{ext}"  # densify and report read this one
    cases: list[tuple[str, list[str], list[Path]]] = [
        ("cp", ["cp", "-r", str(src), str(out["copy"])], [out["copy"]]),
        ("python -c 'import torch'", [sys.executable, "-c", "import torch"], []),
        (
            "prune --scope layer",
            st + ["prune", str(src), "-o", str(out["layer"]), "--sparsity", "0.75", *extra],
            [out["layer"]],
        ),
        (
            "prune --scope global",
            st
            + [
                "prune",
                str(src),
                "-o",
                str(out["global"]),
                "--sparsity",
                "0.75",
                "--scope",
                "global",
                *extra,
            ],
            [out["global"]],
        ),
        ("densify", st + ["densify", str(pruned), "-o", str(out["dense"]), *extra], [out["dense"]]),
        ("report", st + ["report", str(pruned), "--json", *extra], []),
        ("prune --help", st + ["prune", "--help"], []),
        ("prune usage error (exit 2)", st + ["prune", str(src), "--sparsity", "2"], []),
    ]
    envs = {label: None for label, _, _ in cases}
    if args.old is not None:
        old = (
            "prune --scope layer (old)",
            st + ["prune", str(src), "-o", str(out["old"]), "--sparsity", "0.75", *extra],
            [out["old"]],
        )
        cases.insert(3, old)
        envs[old[0]] = {"PYTHONPATH": str(args.old.resolve())}
    if args.naive and args.shape == "gpt3xl":
        cases.insert(
            2,
            (
                "naive load/prune/save",
                [sys.executable, "-c", NAIVE, str(src), str(out["naive"])],
                [out["naive"]],
            ),
        )
    if not pruned.exists():  # the input of densify and report, made once (untimed)
        subprocess.run(
            st + ["prune", str(src), "-o", str(pruned), "--sparsity", "0.75", "--quiet"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    subprocess.run(
        ["cat"] + ([str(p) for p in sorted(src.glob("*"))] if src.is_dir() else [str(src)]),
        stdout=subprocess.DEVNULL,
        check=True,
    )  # warm the page cache
    # Round robin (every case once, then again): a disk that is slow for a while after a large
    # write (this one is) then slows some run of every case alike, not all runs of one case.
    runs: dict[str, list[tuple[float, float, float]]] = {label: [] for label, _, _ in cases}
    busy = subprocess.Popen([sys.executable, "-c", BUSY]) if args.busy else None
    try:
        _rounds(args, cases, envs, runs)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    _report(args, runs, src, size, layers, st, out)


def _rounds(args, cases, envs, runs) -> None:
    for turn in range(args.repeat):
        for label, cmd, clear in cases:
            if label.startswith("naive") and turn:
                continue
            runs[label].append(timed(cmd, clear, envs.get(label), 2 if "exit 2" in label else 0))
            if not (args.check_workers and label == "prune --scope layer"):
                for p in clear:  # at 7B scale the disk holds no more than one output at a time
                    _remove(p)
            r = runs[label][-1]
            print(
                f"{label:26s} exit {r[0]:7.2f} s  sync {r[1]:7.2f} s  {r[2]:7.0f} MiB", flush=True
            )


def _report(
    args, runs, src: Path, size: int, layers: int, st: list[str], out: dict[str, Path]
) -> None:
    results = {
        label: (min(r[0] for r in rs), min(r[1] for r in rs), max(r[2] for r in rs))
        for label, rs in runs.items()
    }
    if args.check_workers:
        timed(
            st + ["prune", str(src), "-o", str(out["one"]), "--sparsity", "0.75", "--workers", "1"],
            [out["one"]],
        )
        print(
            "prune --workers 1 output byte-identical to the default:",
            same_output(out["layer"], out["one"]),
            flush=True,
        )
        _remove(out["one"])
        _remove(out["layer"])
    base_exit, base_sync, _ = results["cp"]
    rss_cap = 600 if args.shape == "gpt3xl" else 1024
    print(
        f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {machine()}; "
        f"{args.shape} checkpoint {size / 1e9:.2f} GB ({layers} layers, bf16"
        f"{', 3 shards' if src.is_dir() else ''}); workers {args.workers or 'default'}"
        f"{'; one other CPU-bound process running' if args.busy else ', quiet'}"
    )
    print(
        "| command | wall, sync (s) | x cp | wall, no sync (s) | x cp | peak RSS (MiB) | target "
        "| met? |"
    )
    print("|---|---:|---:|---:|---:|---:|---|---|")
    for label, (exited, synced, rss) in results.items():
        goal = TARGETS.get(label)
        text, verdict = "", ""
        if label.startswith("prune --help") or label.startswith("prune usage"):
            text, verdict = f"<= {STARTUP_TARGET} s", "yes" if exited <= STARTUP_TARGET else "no"
        elif goal is not None:
            ok_sync = synced <= goal[0] * base_sync
            ok_nosync = goal[1] is None or exited <= goal[1] * base_exit
            text = (
                f"<= {goal[0]}x cp"
                + (f", no sync <= {goal[1]}x" if goal[1] else "")
                + f", <= {rss_cap} MiB"
            )
            verdict = ", ".join(
                [f"time {'yes' if ok_sync else 'no'}"]
                + ([f"no-sync {'yes' if ok_nosync else 'no'}"] if goal[1] else [])
                + [f"memory {'yes' if rss <= rss_cap else 'no'}"]
            )
        print(
            f"| {label} | {synced:.2f} | {synced / base_sync:.2f} | {exited:.2f} | "
            f"{exited / base_exit:.2f} | {rss:.0f} | {text} | {verdict} |"
        )
    for p in out.values():
        _remove(p)


if __name__ == "__main__":
    main()
