"""The run directory's files, each written and read here: run.json, the checkpoints (safetensors,
``mask`` encoding) and their resume state, the log and the plot. What a run does with them (start,
resume, save, stop) is :mod:`sparsetool.train.runstate`.

Layout::

    RUN/run.json                          the resolved options (what --resume re-reads)
    RUN/checkpoints/step-000500/          one directory per save, written then renamed
        model.safetensors                 weights in the ``mask`` encoding (pruned = +0.0,
                                          bool <name>_mask)
        config.json                       the model's shape (n_layer, n_head, ...)
        optimizer.pt                      AdamW and sparsifier state (exact resumption)
        shards/, sparsifier.json          instead of optimizer.pt, an FSDP run's: each rank's slices
                                          of weights, AdamW and masks (torch.distributed.checkpoint)
                                          and the sparsifier's other state (:mod:`.shardedckpt`)
        state.json                        step, data position, RNG states
    RUN/latest                            name of the newest complete checkpoint directory
    RUN/model.safetensors, config.json    the final model (a copy of the last checkpoint's)
    RUN/log.jsonl, log.csv, loss.png      loss, LR, sparsity, tokens/s; the loss curve (drawn
                                          when matplotlib, the ``plot`` extra, is installed)
"""

from __future__ import annotations

import base64
import csv
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from sparsetool.checkpoint import open_checkpoint, write_tensors
from sparsetool.checkpoint.encodings import decode
from sparsetool.checkpoint.provenance import provenance_metadata
from sparsetool.errors import CheckpointError, ConfigError
from sparsetool.models.gpt import model_record

FORMAT_VERSION = 1


def write_json(path: Path, obj: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def save_model(
    path: Path, model: torch.nn.Module, masks: dict[str, torch.Tensor], meta: dict
) -> None:
    """Write float32 weights, the masked ones in the ``mask`` encoding, atomically; ``meta`` is
    this run's provenance record."""
    tensors = {name: t.detach().to("cpu", torch.float32) for name, t in model.state_dict().items()}
    write_tensors(
        path,
        tensors,
        encoding="mask",
        masks={n: m.to(torch.bool) for n, m in masks.items()},
        metadata={"format": "pt", **provenance_metadata(None, meta)},
    )


def checkpoint_name(step: int) -> str:
    """The directory of the checkpoint at ``step`` under RUN/checkpoints: ``step-000500``."""
    return f"step-{step:06d}"


def save_checkpoint(
    run: Path,
    step: int,
    model: torch.nn.Module,
    masks: dict,
    meta: dict,
    model_cfg: dict,
    resume: dict,
    state: dict,
    keep_last: int,
    write_files: Callable[[Path], None] | None = None,
) -> Path:
    """Write checkpoints/step-NNNNNN atomically (a temp dir renamed), then point RUN/latest at it.

    ``write_files`` (a Hugging Face model's config and tokenizer) replaces the built-in GPT's
    config.json; the caller then writes the run's final model itself (not copied to RUN/)."""
    tmp = begin_checkpoint(run, step)
    save_model(tmp / "model.safetensors", model, masks, meta)
    torch.save(resume, tmp / "optimizer.pt")
    return finish_checkpoint(run, step, model_cfg, state, keep_last, write_files)


def checkpoint_temp(run: Path, step: int) -> Path:
    """Where the checkpoint at ``step`` is written before it is renamed into place."""
    return run / "checkpoints" / f".{checkpoint_name(step)}.tmp"


def begin_checkpoint(run: Path, step: int) -> Path:
    """The empty temporary directory of the checkpoint at ``step`` (a stale one of a save cut
    short by a second signal or a crash removed first)."""
    ckdir = run / "checkpoints"
    ckdir.mkdir(parents=True, exist_ok=True)
    for stale in ckdir.glob(".step-*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = checkpoint_temp(run, step)
    tmp.mkdir()
    return tmp


def finish_checkpoint(
    run: Path,
    step: int,
    model_cfg: dict,
    state: dict,
    keep_last: int,
    write_files: Callable[[Path], None] | None = None,
) -> Path:
    """The model's files and state.json into the temporary directory, renamed into place; RUN/latest
    pointed at it; the built-in GPT's model and config copied to RUN/; older checkpoints beyond
    ``keep_last`` removed."""
    ckdir, name = run / "checkpoints", checkpoint_name(step)
    tmp = checkpoint_temp(run, step)
    if write_files is not None:
        write_files(tmp)
    else:
        write_json(tmp / "config.json", {"model_type": "sparsetool-gpt", **model_cfg})
    write_json(tmp / "state.json", state)
    final = ckdir / name
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    (run / "latest.tmp").write_text(name + "\n")
    os.replace(run / "latest.tmp", run / "latest")
    for f in ("model.safetensors", "config.json") if write_files is None else ():
        shutil.copyfile(final / f, run / f"{f}.tmp")
        os.replace(run / f"{f}.tmp", run / f)
    if keep_last > 0:
        old = sorted(p for p in ckdir.iterdir() if p.is_dir() and p.name.startswith("step-"))
        for p in old[:-keep_last]:
            shutil.rmtree(p, ignore_errors=True)
    return final


def latest_checkpoint(run: Path) -> Path:
    pointer = run / "latest"
    if not pointer.exists():
        raise ConfigError(
            f"{run} has no checkpoint to resume from (no {pointer}); start it without --resume"
        )
    path = run / "checkpoints" / pointer.read_text().strip()
    if not (path / "state.json").exists():
        raise CheckpointError(f"{pointer} names {path}, which is missing or incomplete")
    return path


def load_resume(path: Path) -> tuple[dict, dict]:
    state = json.loads((path / "state.json").read_text())
    try:
        resume = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated or foreign file: say which one
        raise CheckpointError(
            f"{path / 'optimizer.pt'} cannot be read ({e}); resume from an earlier checkpoint"
        ) from None
    return state, resume


def rng_state() -> dict:
    out = {"torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = base64.b64encode(torch.cuda.get_rng_state().numpy().tobytes()).decode()
    return out


def set_rng_state(state: dict) -> None:
    raw = base64.b64decode(state["torch"])
    torch.set_rng_state(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(
            torch.frombuffer(bytearray(base64.b64decode(state["cuda"])), dtype=torch.uint8)
        )


def read_init_checkpoint(
    path: str | Path,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict]:
    """Weights, masks and sparsetool metadata of any checkpoint sparsetool can read.

    A targeted tensor pruned without a mask (``zeros`` encoding) gets ``mask = w != 0``.
    Floating tensors keep their stored type (read through a memory map where nothing had to be
    decoded, so a sharded run reads only its slices); copying them into a model converts them.
    """
    weights: dict[str, torch.Tensor] = {}
    masks: dict[str, torch.Tensor] = {}
    with open_checkpoint(path) as ckpt:
        meta = model_record(ckpt)
        for lt in ckpt.logical:
            dense, mask = decode(ckpt, lt)
            weights[lt.name] = dense if dense.is_floating_point() else dense.float()
            if mask is not None:
                masks[lt.name] = mask.bool()
    return weights, masks, meta


NO_PLOT = (
    "matplotlib is not installed: the run writes no loss.png (log.csv holds the same figures); "
    "{extra}"
)
"""The note a run without matplotlib gives at its start (``{extra}``: how to install it)."""


def can_plot() -> bool:
    """Whether matplotlib (the ``plot`` extra) can be imported to draw loss.png; looked up
    without importing it."""
    import importlib.util

    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):  # a module entry set to None, or a broken installation
        return False


class Log:
    """JSONL (every record) and CSV (training rows, with the validation loss and the mask update
    of their step, if any)."""

    def __init__(self, run: Path, keep_until: int | None) -> None:
        self.path = run / "log.jsonl"
        self.records: list[dict] = []
        if keep_until is not None and self.path.exists():
            # Resuming: drop what the interrupted run logged after its last checkpoint, so the
            # log reads as if the run had never stopped.
            for line in self.path.read_text().splitlines():
                rec = json.loads(line)
                if rec.get("step", 0) <= keep_until:
                    self.records.append(rec)
        self.path.write_text("".join(json.dumps(r) + "\n" for r in self.records))
        self._fh = self.path.open("a")

    def write(self, record: dict) -> None:
        self.records.append(record)
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()

    def write_csv(self, run: Path) -> None:
        cols = [
            "step",
            "loss",
            "val_loss",
            "lr",
            "sparsity",
            "tokens_per_s",
            "tokens",
            "elapsed_s",
            "mask_dropped",
            "mask_grown",
            "drop_fraction",
            "grown_survived",
        ]
        val = {r["step"]: r["val_loss"] for r in self.records if r.get("kind") == "eval"}
        upd = {
            r["step"]: {
                "mask_dropped": r["dropped"],
                "mask_grown": r["grown"],
                "drop_fraction": r["drop_fraction"],
                "grown_survived": "" if r["grown_survived"] is None else r["grown_survived"],
            }
            for r in self.records
            if r.get("kind") == "mask_update"
        }
        tmp = run / "log.csv.tmp"
        with tmp.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
            w.writeheader()
            for r in self.records:
                if r.get("kind") == "train":
                    w.writerow({**r, "val_loss": val.get(r["step"], ""), **upd.get(r["step"], {})})
        os.replace(tmp, run / "log.csv")

    def plot(self, run: Path, title: str, unit: str = "byte") -> None:
        """RUN/loss.png, atomically (:meth:`loss_figure`)."""
        from sparsetool.util.plotting import pyplot

        plt = pyplot("writing the run's loss.png")
        fig = self.loss_figure(title, unit)
        tmp = run / "loss.tmp.png"
        fig.savefig(tmp, dpi=110)
        plt.close(fig)
        os.replace(tmp, run / "loss.png")

    def loss_figure(self, title: str, unit: str = "byte"):
        """The loss curve: the raw training loss as a faint line under its moving average
        (:func:`smoothed`), validation as points, stages as dotted lines; a legend names each."""
        from sparsetool.util.plotting import pyplot

        plt = pyplot("writing the run's loss.png")
        train = [(r["step"], r["loss"]) for r in self.records if r.get("kind") == "train"]
        val = [(r["step"], r["val_loss"]) for r in self.records if r.get("kind") == "eval"]
        fig, ax = plt.subplots(figsize=(7, 4))
        if train:
            steps, loss = zip(*train)
            weight = smoothing_weight(len(loss))
            if not weight:  # too few steps to smooth
                ax.plot(steps, loss, lw=1.0, color="tab:blue", label="train")
            else:
                ax.plot(steps, loss, lw=0.6, alpha=0.3, color="tab:blue", label="train (each step)")
                ax.plot(
                    steps,
                    smoothed(loss, weight),
                    lw=1.8,
                    color="tab:blue",
                    label=f"train, smoothed (EMA {weight:g}, forward and back)",
                )
        if val:
            ax.plot(*zip(*val), "o-", ms=3, color="tab:orange", label="validation")
        for r in self.records:
            if r.get("kind") == "stage":
                ax.axvline(r["step"], color="grey", ls=":", lw=1)
                ax.annotate(
                    f"stage {r['stage']}: {r['sparsity']:.0%} sparse",
                    (r["step"], 1.0),
                    xycoords=("data", "axes fraction"),
                    xytext=(3, -10),
                    textcoords="offset points",
                    fontsize=7,
                    color="grey",
                )
        ax.set_xlabel("step")
        ax.set_ylabel(f"cross-entropy (nats/{unit})")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        return fig


def smoothing_weight(points: int) -> float:
    """The moving average's weight for a curve of ``points`` steps: about ``points/30`` steps on
    each side count (0 below 30 steps: nothing to smooth; at most 0.98).

    >>> smoothing_weight(10), smoothing_weight(100), smoothing_weight(300), smoothing_weight(100000)
    (0.0, 0.7, 0.9, 0.98)
    """
    if points < 30:
        return 0.0
    return min(0.98, round(1.0 - 30.0 / points, 2))


def _ema(values, weight: float) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc = weight * acc + (1.0 - weight) * v
        out.append(acc / (1.0 - weight ** (i + 1)))  # debiased: starts at the first value, not 0
    return out


def smoothed(values, weight: float) -> list[float]:
    """The exponential moving average of ``values`` taken forward, then backward, so that it
    does not lag behind a falling loss; each pass debiased (as TensorBoard's smoothing).

    >>> [round(v, 3) for v in smoothed([4.0, 2.0, 4.0, 2.0], 0.5)]
    [3.479, 2.884, 3.175, 2.667]
    >>> smoothed([1.0, 3.0], 0.0)
    [1.0, 3.0]
    >>> # no lag on a straight line:
    >>> round(smoothed([5.0 - 0.01 * i for i in range(200)], 0.9)[100], 4)
    4.0
    """
    return _ema(_ema(values, weight)[::-1], weight)[::-1]
