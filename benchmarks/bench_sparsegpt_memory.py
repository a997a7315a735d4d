"""SparseGPT's peak memory and time on the Llama-2-7B-shaped models of ``bench_streamed.py``: this
tree against an older sparsetool (``--old SRC_DIR``) and llm-compressor's SparseGPT
(``--peer-python``: an interpreter that has llmcompressor; it runs ``peer_sparsegpt.py``), each
command in its own process under ``/usr/bin/time -f "%e %M"``, one after the other:

  python benchmarks/bench_sparsegpt_memory.py --workdir /tmp/sgpt-bench --layers 2,8 --old OLD_SRC \
      --peer-python /path/to/python [--peer-layers 2] [--samples 8] [--seq 128]

The models (``llama7b-NL``) and the calibration text (``calib.txt``) are the ones
``bench_streamed.py --workdir DIR`` makes there. ``prune --method sparsegpt --sparsity 0.5
--samples N --seq T`` runs with ``PYTHONPATH`` naming this tree or the old one; after both, their
outputs are compared tensor by tensor (bytes), then deleted. Prints a Markdown table: wall seconds,
peak RSS (MB, as ``time`` reports it: KiB / 1024) and the memory plan's estimate.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def timed(cmd: list[str], env: dict, log: Path) -> tuple[float, float, dict | None]:
    """(wall seconds, peak RSS in MB, the --json output or None)."""
    timing = log.with_suffix(".time")
    with open(log.with_suffix(".out"), "wb") as out, open(log.with_suffix(".err"), "wb") as err:
        rc = subprocess.call(
            ["/usr/bin/time", "-f", "%e %M", "-o", str(timing), *cmd],
            stdout=out,
            stderr=err,
            env=env,
            cwd="/",
        )
    seconds, kib = timing.read_text().split()[-2:]
    result = None
    if rc == 0:
        try:
            result = json.loads(log.with_suffix(".out").read_text())
        except json.JSONDecodeError:
            pass
    else:
        print(f"<!-- failed ({rc}): {' '.join(cmd)} -->")
    return float(seconds), int(kib) / 1024, result


def digests(directory: Path) -> dict[str, str]:
    """Every stored tensor's SHA-256, read straight from the files (bf16 has no numpy type)."""
    import struct

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
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/sgpt-bench"))
    ap.add_argument("--layers", default="2,8")
    ap.add_argument(
        "--old", type=Path, required=True, help="source checkout of the older sparsetool"
    )
    ap.add_argument("--peer-python", default=None, help="a Python that has llmcompressor")
    ap.add_argument("--peer-layers", default="2")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    args = ap.parse_args()
    work = args.workdir
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    calib = work / "calib.txt"
    base = {**os.environ, "HF_HUB_OFFLINE": "1"}
    this = str(HERE.parent)
    print("| model | code | wall s | peak RSS MB | plan's estimate MB |")
    print("|---|---|---:|---:|---:|")
    for layers in [int(x) for x in args.layers.split(",") if x]:
        model = work / f"llama7b-{layers}L"
        label = f"{layers} blocks"
        outs = {}
        for code, src in (("before", str(args.old)), ("after", this)):
            out = work / f"out-{code}-{layers}L"
            shutil.rmtree(out, ignore_errors=True)
            cmd = [
                sys.executable,
                "-m",
                "sparsetool",
                "prune",
                str(model),
                "-o",
                str(out),
                "--method",
                "sparsegpt",
                "--sparsity",
                "0.5",
                "--calibration",
                str(calib),
                "--samples",
                str(args.samples),
                "--seq",
                str(args.seq),
                "--json",
            ]
            seconds, peak, result = timed(
                cmd, {**base, "PYTHONPATH": src}, logs / f"{code}-{layers}L"
            )
            memory = (result or {}).get("memory")
            plan = f"{memory['peak_estimate'] / 2**20:.0f}" if memory else "-"
            print(
                f"| {label} | sparsetool {code} | {seconds:.0f} | {peak:.0f} | {plan} |", flush=True
            )
            outs[code] = out
        a, b = digests(outs["before"]), digests(outs["after"])
        differ = sorted(n for n in a if a[n] != b.get(n))
        print(
            f"<!-- {label}: {len(a)} tensors compared, {len(differ)} differ {differ[:5]} -->",
            flush=True,
        )
        for out in outs.values():
            shutil.rmtree(out, ignore_errors=True)
        if args.peer_python and str(layers) in args.peer_layers.split(","):
            out = work / f"out-peer-{layers}L"
            cmd = [
                args.peer_python,
                str(HERE / "peer_sparsegpt.py"),
                str(model),
                str(calib),
                str(out),
                "--samples",
                str(args.samples),
                "--seq",
                str(args.seq),
            ]
            seconds, peak, _ = timed(cmd, {**base, "PYTHONPATH": this}, logs / f"peer-{layers}L")
            print(f"| {label} | llm-compressor | {seconds:.0f} | {peak:.0f} | - |", flush=True)
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
