"""torch's threads on a quiet and on a busy machine: train, eval and a Wanda prune \
(a script, not a test).

  python benchmarks/bench_threads.py [--repeat 2] [--baseline SRC] [--steps 300]
                                     [--only train,eval,wanda] [--variant LABEL SPEC ...]
  python benchmarks/bench_threads.py --wait-policy [--repeat 2]

Each workload is a whole ``sparsetool`` command in its own process (import included), timed by the
wall clock, under each variant:
  - ``default``: the command as a user types it;
  - ``threads1``: the same with ``--threads 1``;
  - ``main`` (with ``--baseline SRC``): the command as it was before, from the source tree SRC
    (e.g. ``git archive <commit> | tar -x -C SRC``), where ``--threads`` did not exist on eval and
    prune;
  - any ``--variant LABEL SPEC`` (repeatable; ENV=VALUE pairs joined by commas, ``@``
    runs the baseline tree, ``+ARG`` adds a command-line argument), e.g.
    ``--variant main-passive @,OMP_WAIT_POLICY=PASSIVE``.
Each runs quiet and then "busy": with a second CPU-bound process (``python -c "while True:
pass"``) running for the whole measurement. Variants are interleaved and each is run ``--repeat``
times: the machine is shared, so only ratios measured in the same run are compared; the table
prints the median wall seconds, each variant's ratio to ``threads1`` in the same condition, every
run's seconds, and the median CPU seconds (user + system: spinning workers show there).

Workloads (built once into benchmarks/work/threads/, git-ignored):
  - train: ``train --preset tiny --steps 300`` (the built-in corpus);
  - eval: ``eval`` of four tiny checkpoints (that run, pruned to 50%, 75% and 90%) on the first
    --eval-tokens bytes of the held-out text;
  - wanda: ``prune --method wanda --sparsity 0.5 --calibration`` of a random Llama (4 layers,
    width 128, a 1,024-entry BPE vocabulary), 32 windows of 128 tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from measure import run_measured

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "benchmarks" / "work" / "threads"
BUSY = [sys.executable, "-c", "while True: pass"]

# --wait-policy: 3,000 small matmul+GELU steps on 2 threads with OMP_WAIT_POLICY=PASSIVE set before
# torch is imported, set after it, or not set, and on 1 thread; seconds of wall and CPU time.
WAIT_POLICY = """
import os, resource, sys, time
mode = sys.argv[1]
if mode == "before":
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
import torch
if mode == "after":
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
torch.set_num_threads(int(sys.argv[2]))
x, w = torch.randn(256, 512), torch.randn(512, 512)
t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
for _ in range(3000):
    y = torch.nn.functional.gelu(x @ w)
c1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime
print(
    f"PASSIVE {mode:6} threads {sys.argv[2]}: wall {time.perf_counter() - t0:6.2f} s, "
    f"CPU {cpu:6.2f} s"
)
"""


def wait_policy(repeat: int, conditions: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    for condition in conditions:
        busy = subprocess.Popen(BUSY) if condition == "busy" else None
        try:
            for _ in range(repeat):
                for mode, n in (("unset", "2"), ("before", "2"), ("after", "2"), ("unset", "1")):
                    r = subprocess.run(
                        [sys.executable, "-c", WAIT_POLICY, mode, n],
                        env=env,
                        check=True,
                        capture_output=True,
                        text=True,
                    )
                    print(f"{condition:5} {r.stdout.strip()}", flush=True)
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()


def tool(src: Path, args: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of ``sparsetool ARGS`` from source tree ``src``
    (checked: exit 0)."""
    full = {**os.environ, "PYTHONPATH": str(src), "HF_HUB_OFFLINE": "1", **(env or {})}
    for name in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS"):
        if name not in (env or {}):
            full.pop(name, None)
    m = run_measured([sys.executable, "-m", "sparsetool", *args], env=full, keep_output=False)
    if not m.ok:
        raise SystemExit(f"sparsetool {' '.join(args)} failed ({m.returncode})")
    return m.wall_s, m.cpu_s


def build(steps: int, eval_tokens: int) -> dict[str, list[str]]:
    """The three workloads' arguments (an output path last where there is one)."""
    WORK.mkdir(parents=True, exist_ok=True)
    run = WORK / "run"
    if not (run / "model.safetensors").is_file():
        tool(
            ROOT,
            [
                "train",
                "-o",
                str(run),
                "--preset",
                "tiny",
                "--steps",
                "300",
                "--json",
                "--threads",
                "1",
            ],
        )
    ckpts = [str(run / "model.safetensors")]
    for s in ("0.5", "0.75", "0.9"):
        out = WORK / f"pruned-{s}.safetensors"
        if not out.is_file():
            tool(ROOT, ["prune", ckpts[0], "-o", str(out), "--sparsity", s, "-q"])
        ckpts.append(str(out))
    llama, calib = WORK / "llama", WORK / "calib.txt"
    if not (llama / "config.json").is_file():
        make_llama(llama, calib)
    return {
        "train": ["train", "--preset", "tiny", "--steps", str(steps), "--json", "-o"],
        "eval": ["eval", *ckpts, "--max-tokens", str(eval_tokens), "--json"],
        "wanda": [
            "prune",
            str(llama),
            "--sparsity",
            "0.5",
            "--method",
            "wanda",
            "--calibration",
            str(calib),
            "--samples",
            "32",
            "--seq",
            "128",
            "-q",
            "-o",
        ],
    }


def make_llama(path: Path, calib: Path) -> None:
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from sparsetool.util.corpus import load_corpus

    text = load_corpus(None).train[: 1 << 20].tobytes().decode("utf-8", errors="replace")
    calib.write_text(text)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        [text],
        trainers.BpeTrainer(
            vocab_size=1024,
            special_tokens=["<unk>", "<s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            num_hidden_layers=4,
            hidden_size=128,
            intermediate_size=256,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=1024,
            max_position_embeddings=256,
            bos_token_id=1,
            eos_token_id=1,
            pad_token_id=None,
        )
    ).save_pretrained(path)
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="<s>"
    ).save_pretrained(path)


def parse_variant(
    label: str, spec: str, baseline: Path | None
) -> tuple[str, Path, list[str], dict]:
    src, args, env = ROOT, [], {}
    for part in filter(None, spec.split(",")):
        if part == "@":
            if baseline is None:
                sys.exit(f"error: --variant {label}: '@' needs --baseline SRC")
            src = baseline
        elif part.startswith("+"):
            args.append(part[1:])
        else:
            k, _, v = part.partition("=")
            env[k] = v
    return label, src, args, env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--eval-tokens", type=int, default=20_000)
    ap.add_argument(
        "--baseline", type=Path, help="a source tree of the code before (variant 'main')"
    )
    ap.add_argument("--only", default="train,eval,wanda")
    ap.add_argument("--conditions", default="quiet,busy")
    ap.add_argument("--variant", nargs=2, action="append", default=[], metavar=("LABEL", "SPEC"))
    ap.add_argument(
        "--wait-policy",
        action="store_true",
        help="only check when OMP_WAIT_POLICY takes effect (before or after torch loads)",
    )
    args = ap.parse_args()
    if args.wait_policy:
        wait_policy(args.repeat, args.conditions.split(","))
        return
    work = build(args.steps, args.eval_tokens)
    variants = [("default", ROOT, [], {}), ("threads1", ROOT, ["--threads", "1"], {})]
    if args.baseline:
        variants.append(("main", args.baseline, [], {}))
    variants += [parse_variant(label, spec, args.baseline) for label, spec in args.variant]
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M')}, {platform.node()}, {os.cpu_count()} CPUs "
        f"(usable {len(os.sched_getaffinity(0))}), Python {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.2f} at start",
        flush=True,
    )
    results: dict[tuple[str, str, str], list[float]] = {}
    cpus: dict[tuple[str, str, str], list[float]] = {}
    for condition in args.conditions.split(","):
        busy = subprocess.Popen(BUSY) if condition == "busy" else None
        try:
            for workload in args.only.split(","):
                for i in range(args.repeat):
                    order = variants if i % 2 == 0 else variants[::-1]
                    for label, src, extra, env in order:
                        argv = list(work[workload])
                        if argv[-1] == "-o":  # a fresh output each time
                            out = WORK / "out" / f"{workload}-{label}-{condition}-{i}"
                            subprocess.run(["rm", "-rf", str(out)], check=True)
                            argv.append(str(out))
                        load = os.getloadavg()[0]
                        seconds, cpu = tool(src, argv + extra, env)
                        results.setdefault((condition, workload, label), []).append(seconds)
                        cpus.setdefault((condition, workload, label), []).append(cpu)
                        print(
                            f"{condition:5} {workload:5} {label:14} {seconds:7.2f} s wall "
                            f"{cpu:7.2f} s CPU (load average {load:.1f})",
                            flush=True,
                        )
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
    print(
        "\n| condition | workload | "
        + " | ".join(f"{v[0]} s (x threads1)" for v in variants)
        + " |"
    )
    print("|---|---|" + "---|" * len(variants))
    for condition in args.conditions.split(","):
        for workload in args.only.split(","):
            ref = statistics.median(results[(condition, workload, "threads1")])
            cells = []
            for label, *_ in variants:
                runs = results[(condition, workload, label)]
                med, cpu = (
                    statistics.median(runs),
                    statistics.median(cpus[(condition, workload, label)]),
                )
                cells.append(
                    f"{med:.2f} ({med / ref:.2f}x; {', '.join(f'{s:.1f}' for s in runs)}; "
                    f"CPU {cpu:.1f})"
                )
            print(f"| {condition} | {workload} | " + " | ".join(cells) + " |")
    print(json.dumps({" ".join(k): [results[k], cpus[k]] for k in results}), file=sys.stderr)


if __name__ == "__main__":
    main()
