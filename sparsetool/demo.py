"""The whole toolkit end to end on built-in data (``sparsetool demo``).

SPDF in miniature (Thangarasa et al. 2023): a small dense GPT and a static 75%-sparse one are
pre-trained with the same budget on the built-in Python corpus; the sparse one is then fine-tuned
densely on the built-in English text. All three are evaluated on held-out Python and held-out
English, the sparse pre-trained and fine-tuned weights are compared, and the FLOPs of each run
come from :mod:`sparsetool.flops` for the run's real shapes, sparsity and tokens.

Every step calls the library function the matching command calls (the trainer, ``eval``,
``diff``, ``report``, ``flops``); this module only chains them and writes ``summary.json``.
Progress goes to a ``progress(kind, info)`` callback: ``phase`` when a phase starts, ``step``
as it advances, ``done`` when it ends.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sparsetool.checkpoint.output_files import (
    ResultDict,
    check_writable,
    reclaiming,
    write_error,
)
from sparsetool.errors import SparsetoolError

__all__ = [
    "DEFAULT_OUTPUT",
    "DEFAULT_STEPS",
    "DEFAULT_FINETUNE_STEPS",
    "SPARSITY",
    "MODEL",
    "PHASES",
    "check_output",
    "run_demo",
    "plot_perplexity",
]

PhaseProgress = Callable[[str, dict], None]  # demo reports phases and steps, not counts

DEFAULT_OUTPUT = "sparsetool-demo"
DEFAULT_STEPS = 1000  # per pre-trained model: the whole demo takes 1.5-2 min on 2 CPU cores
DEFAULT_FINETUNE_STEPS = 300
SPARSITY = 0.75
MODEL: dict[str, Any] = {"preset": "tiny", "n_layer": 2, "n_head": 4, "d_model": 64, "context": 64}
BATCH = 16  # sequences per step, as sparsetool train's default
EVAL_BYTES = 64 * 1024  # of each held-out split (the English one is smaller: all of it)
MARKER = ".sparsetool-demo"  # written first: marks a directory a later demo may replace
# What a demo writes: a later demo removes these (and nothing else) from its directory.
PRODUCTS = (
    "dense",
    "sparse",
    "finetuned",
    "heldout",
    "perplexity.png",
    "angular-distance.png",
    "summary.json",
    MARKER,
)
PHASES = (  # key, title, what its progress counts
    ("dense", "pre-train dense", "steps"),
    ("sparse", f"pre-train {SPARSITY:.0%} sparse", "steps"),
    ("finetuned", "fine-tune sparse densely on English", "steps"),
    ("eval", "evaluate on held-out text", "evaluations"),
    ("diff", "diff sparse -> fine-tuned", "tensors"),
)


def check_output(output: str | Path) -> bool:
    """Refuse a directory that holds anything but an earlier demo's output; True if it is one."""
    out = Path(output)
    if out.exists() and not out.is_dir():
        raise SparsetoolError(
            f"-o/--output {out} is a file; give a directory for the demo's output"
        )
    if not out.exists() or not any(out.iterdir()):
        return False
    if not (out / MARKER).exists():
        raise SparsetoolError(
            f"-o/--output {out} exists and is not empty (and is not an earlier "
            "sparsetool demo output); pick a new directory or empty it"
        )
    return True


def run_demo(
    output: str | Path = DEFAULT_OUTPUT,
    *,
    steps: int = DEFAULT_STEPS,
    finetune_steps: int = DEFAULT_FINETUNE_STEPS,
    seed: int = 0,
    threads: int | None = None,
    progress: PhaseProgress | None = None,
) -> ResultDict:
    """Run the demo into ``output`` and return its summary (also written to summary.json).

    ``output`` must be new, empty, or an earlier demo's output (whose files are replaced). On
    any failure or interruption nothing the demo wrote is left behind. The three trainings run
    torch on ``threads`` threads (default 1: the fastest for models this small). The summary's
    ``reclaimed`` (not a key): the temporaries of killed runs its writes removed (an error
    carries them too).
    """
    for name, value in (("--steps", steps), ("--finetune-steps", finetune_steps)):
        if int(value) < 1:
            raise SparsetoolError(f"{name} {value}: must be at least 1")
    with reclaiming() as reclaimed:
        summary = _demo_into(Path(output), steps, finetune_steps, seed, threads, progress)
    return ResultDict(summary, reclaimed)


def _demo_into(
    out: Path,
    steps: int,
    finetune_steps: int,
    seed: int,
    threads: int | None,
    progress: PhaseProgress | None,
) -> dict[str, Any]:
    earlier = check_output(out)
    check_writable(out, "-o", directory=True)
    outermost = out
    while not outermost.parent.exists():
        outermost = outermost.parent
    # the outermost directory this run creates (None: out exists)
    created = None if out.exists() else outermost
    import torch

    threads_before = torch.get_num_threads()
    try:
        if earlier:
            _remove_products(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / MARKER).write_text("sparsetool demo output; `sparsetool demo -o` may replace it\n")
        return _Demo(out, steps, finetune_steps, seed, progress, threads or 1).run()
    except BaseException as e:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        else:
            _remove_products(out)
        if isinstance(e, SparsetoolError) and isinstance(e.__context__, KeyboardInterrupt):
            raise KeyboardInterrupt from None  # the trainer's "--resume continues" does not apply
        if isinstance(e, OSError):  # a file the demo writes (no space, read-only, ...)
            raise write_error(e, out, "-o") from None
        raise
    finally:
        torch.set_num_threads(threads_before)


def _remove_products(out: Path) -> None:
    for name in PRODUCTS:
        p = out / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        elif p.exists() or p.is_symlink():
            p.unlink()


class _Demo:
    def __init__(
        self,
        out: Path,
        steps: int,
        finetune_steps: int,
        seed: int,
        progress: PhaseProgress | None,
        threads: int = 1,
    ) -> None:
        self.out, self.steps, self.finetune_steps, self.seed = out, steps, finetune_steps, seed
        self.threads = threads
        self.report = progress or (lambda kind, info: None)
        self.seconds: dict[str, float] = {}

    # ---------------------------------------------------------------- phases
    def _phase(self, key: str, total: int) -> None:
        index = [k for k, _, _ in PHASES].index(key)
        self.report(
            "phase",
            {
                "phase": key,
                "title": PHASES[index][1],
                "unit": PHASES[index][2],
                "index": index + 1,
                "phases": len(PHASES),
                "total": total,
            },
        )
        self._t0 = time.perf_counter()

    def _step(self, key: str, done: int, total: int, **extra: Any) -> None:
        self.report("step", {"phase": key, "done": done, "total": total, **extra})

    def _done(self, key: str) -> None:
        self.seconds[key] = round(time.perf_counter() - self._t0, 3)
        self.report("done", {"phase": key, "seconds": self.seconds[key]})

    def _train(self, key: str, steps: int, **options: Any) -> dict:
        from sparsetool.train.configkeys import merge
        from sparsetool.train.loop import train

        cfg = merge(
            {},
            {
                **MODEL,
                "out": str(self.out / key),
                "steps": steps,
                "seed": self.seed,
                "batch_size": BATCH,
                "threads": self.threads,
                "eval_every": max(1, steps // 5),
                **options,
            },
        )

        def callback(kind: str, info: dict) -> None:
            if kind == "step":
                self._step(key, info["step"], steps, loss=info["loss"])

        self._phase(key, steps)
        summary = train(cfg, callback=callback)
        self._done(key)
        return summary

    # ---------------------------------------------------------------- the run
    def run(self) -> dict[str, Any]:
        t_start = time.perf_counter()
        runs = {
            "dense": self._train("dense", self.steps, warmup=max(1, self.steps // 10)),
            "sparse": self._train(
                "sparse", self.steps, warmup=max(1, self.steps // 10), sparsity=SPARSITY
            ),
        }
        from sparsetool.util.corpus import ENGLISH

        runs["finetuned"] = self._train(
            "finetuned",
            self.finetune_steps,
            init=str(self.out / "sparse" / "model.safetensors"),
            dense=True,
            data=ENGLISH,
            lr=5e-4,
            warmup=max(1, self.finetune_steps // 10),
        )
        texts = self._heldout_texts()
        evals = self._evaluate(texts)
        diff_result = self._diff()
        models = self._models(runs, evals)
        flops = self._flops(runs)
        for m in models:
            m.update(flops[m["name"]])
        summary = {
            "producer": "sparsetool demo",
            "output": str(self.out),
            "seconds": round(time.perf_counter() - t_start, 3),
            "phase_seconds": dict(self.seconds),
            "settings": {
                "steps": self.steps,
                "finetune_steps": self.finetune_steps,
                "seed": self.seed,
                "sparsity": SPARSITY,
                "model": dict(MODEL),
                "batch_size": BATCH,
                "pretrain_data": _source(self.out / "dense"),
                "finetune_data": _source(self.out / "finetuned"),
            },
            "models": models,
            "heldout": {k: {"file": str(p), "bytes": p.stat().st_size} for k, p in texts.items()},
            "eval": {k: r.to_json() for k, r in evals.items()},
            "diff": {
                **diff_result.summary,
                "by_kind": {kind: s.angular_distance for kind, s in _by_kind(diff_result).items()},
            },
            "files": {
                "summary": str(self.out / "summary.json"),
                "perplexity_plot": str(self.out / "perplexity.png"),
                "angular_distance_plot": str(self.out / "angular-distance.png"),
                "loss_curves": [str(self.out / k / "loss.png") for k in runs],
            },
        }
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary

    def _heldout_texts(self) -> dict[str, Path]:
        """The evaluated text as files, so ``sparsetool eval ... --text FILE`` gives the same."""
        from sparsetool.util.corpus import ENGLISH, load_corpus

        folder = self.out / "heldout"
        folder.mkdir()
        texts = {}
        for key, source in (("python", None), ("english", ENGLISH)):
            val = load_corpus(source).val[:EVAL_BYTES].tobytes()
            texts[key] = folder / f"{key}.txt"
            texts[key].write_text(val.decode("utf-8", errors="replace"), encoding="utf-8")
        return texts

    def _evaluate(self, texts: dict[str, Path]) -> dict[str, Any]:
        from sparsetool.ops.eval import evaluate

        dirs = [self.out / k for k in ("dense", "sparse", "finetuned")]
        self._phase("eval", 2 * len(dirs))
        results, done = {}, 0
        for key, path in texts.items():

            def progress(name: str, d: int, t: int, _base: int = done) -> None:
                if d == t:
                    self._step("eval", _base + dirs.index(Path(name)) + 1, 2 * len(dirs))

            results[key] = evaluate(dirs, text=path, batch=32, progress=progress)
            done += len(dirs)
        plot_perplexity(results, self.out / "perplexity.png")
        self._done("eval")
        return results

    def _diff(self) -> Any:
        from sparsetool.ops.diff import diff, plot_diff
        from sparsetool.ops.report import summarize

        self._phase("diff", summarize(self.out / "sparse").summary["targeted_tensors"])
        result = diff(
            self.out / "sparse",
            self.out / "finetuned",
            progress=lambda stage, d, t: self._step("diff", d, t),
        )
        t = result.total
        plot_diff(
            result,
            self.out / "angular-distance.png",
            title=f"sparse pre-trained ({SPARSITY:.0%}) -> dense fine-tuned on English\n"
            f"angular distance {t.angular_distance:.4g} over all targeted weights",
        )
        self._done("diff")
        return result

    def _models(self, runs: dict[str, dict], evals: dict[str, Any]) -> list[dict]:
        from sparsetool.ops.report import summarize

        models = []
        for i, (name, run) in enumerate(runs.items()):
            counts = summarize(self.out / name).summary
            models.append(
                {
                    "name": name,
                    "run_dir": str(self.out / name),
                    "checkpoint": run["checkpoint"],
                    "loss_curve": run["plot"],
                    "steps": run["steps"],
                    "tokens": run["tokens"],
                    "train_seconds": run["elapsed_s"],
                    "val_loss": run["val_loss"],
                    "targeted_sparsity": counts["targeted_sparsity"],
                    "targeted_numel": counts["targeted_numel"],
                    "targeted_nonzero": counts["targeted_nonzero"],
                    "targeted_tensors": counts["targeted_tensors"],
                    "params": evals["python"].rows[i].params,
                    "perplexity": {k: r.rows[i].perplexity for k, r in evals.items()},
                    "bits_per_byte": {k: r.rows[i].bits_per_byte for k, r in evals.items()},
                }
            )
        return models

    def _flops(self, runs: dict[str, dict]) -> dict[str, dict]:
        """Training FLOPs of each run from the flops library, for its checkpoint's measured
        shapes and sparsity and the tokens it trained on; ratios to the dense run."""
        from sparsetool import flops as F

        context = MODEL["context"]
        ft_tokens = runs["finetuned"]["tokens"]
        acc = {}
        for name in ("dense", "sparse"):
            m = F.from_checkpoint(self.out / name, seq_len=context)
            acc[name] = F.account(
                m.config,
                sparsity=m.layer_sparsity,
                params=m.params,
                tokens=runs[name]["tokens"],
                finetune_tokens=ft_tokens,
                finetune_seq_len=context,
            )
        dense = acc["dense"]["total_train_flops"]
        sparse = acc["sparse"]
        return {
            "dense": {"train_flops": dense, "train_flops_ratio": dense / dense},
            "sparse": {
                "train_flops": sparse["total_train_flops"],
                "train_flops_ratio": sparse["total_train_flops"] / dense,
            },
            # SPDF Table 2: sparse pre-training + dense fine-tuning against dense pre-training +
            # the same fine-tuning
            "finetuned": {
                "train_flops": sparse["end_to_end_flops"],
                "finetune_flops": sparse["finetune_flops"],
                "train_flops_ratio": sparse["end_to_end_ratio"],
            },
        }


def _source(run_dir: Path) -> str:
    return json.loads((run_dir / "run.json").read_text())["data"]["source"]


def _by_kind(result: Any) -> dict[str, Any]:
    """Stats pooled per matrix kind (Q, K, V, attention out, FFN in, FFN out) over all layers."""
    from sparsetool.ops.diff import KINDS, Stats

    pooled: dict[str, Any] = {}
    for r in result.rows:
        pooled[r.kind] = pooled.get(r.kind, Stats()) + r.stats
    return {k: pooled[k] for k in KINDS if k in pooled}


def plot_perplexity(results: dict[str, Any], out: str | Path) -> Path:
    """Bars: perplexity of each model (groups) on each held-out text (colours), values on top."""
    from sparsetool.util.plotting import pyplot

    plt = pyplot()

    labels = {
        "dense": "dense",
        "sparse": f"{SPARSITY:.0%} sparse",
        "finetuned": "sparse ->\ndense fine-tuned",
    }
    texts = list(results)
    names = [Path(r.name).name for r in results[texts[0]].rows]
    width = 0.8 / len(texts)
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for j, key in enumerate(texts):
        values = [r.perplexity for r in results[key].rows]
        xs = [i + (j - (len(texts) - 1) / 2) * width for i in range(len(names))]
        bars = ax.bar(xs, values, width, label=f"held-out {key.capitalize()}")
        ax.bar_label(bars, [f"{v:.2f}" for v in values], fontsize=8, padding=2)
    ax.set_xticks(range(len(names)), [labels.get(n, n) for n in names], fontsize=9)
    ax.set_ylabel("perplexity (per byte; lower is better)")
    ax.set_title("sparsetool demo: perplexity on held-out text", fontsize=10)
    ax.margins(y=0.12)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
