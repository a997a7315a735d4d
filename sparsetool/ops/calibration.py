"""The calibration pass prune and shrink share: the text's options and windows, the blocks run
one at a time, the routing of a Mixture of Experts, and the memory the pass holds.

``prune --method wanda|sparsegpt`` (with OWL's outlier pass) and every kind of ``shrink`` run the
same pass: calibration text is cut into windows (:func:`calibration_windows`, their length by
:func:`window_length`), the inputs of block 0 are captured from the model's own forward pass, and
each block in turn is read from the checkpoint, handed to the caller (who hooks its layers, runs
it, changes it), run for the next block's inputs unless the caller already did, and released
(:class:`BlockPass`). Memory holds one block and the windows' hidden states whatever the depth;
:func:`pass_memory` is that part of a run's :class:`~sparsetool.util.memory.MemoryPlan`, to which
each command adds what it gathers (statistics, scores, refits) before any text runs.

A Mixture of Experts' experts module is recognised by :func:`is_experts`; the tokens routed to an
expert and what its down projection reads come from :func:`routing_of`, :func:`routed_inputs`
and :func:`gated_product`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparsetool.errors import ConfigError, SparsetoolError
from sparsetool.ops.text import DEFAULT_FIELD, is_records
from sparsetool.util.memory import MemoryPlan, budget, process_memory
from sparsetool.util.progress import Progress
from sparsetool.util.wording import plural

if TYPE_CHECKING:  # torch loads when a pass runs: the options import DEFAULT_SEQ without it
    import torch

    from sparsetool.models.blocks import BlockModel, Call

__all__ = [
    "DEFAULT_SAMPLES",
    "DEFAULT_SEQ",
    "TEXT_FIELD_HELP",
    "check_text_field",
    "BlockPass",
    "Step",
    "activation_bytes",
    "calibration_windows",
    "unpicked_windows",
    "gated_product",
    "hidden_bytes",
    "is_experts",
    "pass_memory",
    "routed_bytes",
    "routed_inputs",
    "routing_of",
    "window_length",
]

DEFAULT_SEQ = 512  # tokens per calibration window (the Wanda and SparseGPT papers' C4 use 2048)
DEFAULT_SAMPLES = 128  # calibration windows
TEXT_FIELD_HELP = (
    "The field of each --calibration record (.jsonl, .parquet, .arrow) holding its text, "
    "or a list of chat messages the model's chat template renders."
)
FLOAT32 = 4  # bytes of a float32
BLOCK_ENDS = 2  # a block's inputs and its outputs are held at once
ROUTED_COPIES = 2  # a token's routed inputs, as they are and scaled by their routing weight


# ---------------------------------------------------------------------------------- the text
def check_text_field(text_field: str, calibration: str | Path | None) -> None:
    """``--text-field``: a name, and read only from records (a directory may hold some).

    >>> check_text_field("text", "calib.txt"), check_text_field("messages", "chat.jsonl")
    (None, None)
    """
    if not text_field:
        raise ConfigError("--text-field: give the name of the field holding each record's text")
    if text_field == DEFAULT_FIELD or calibration is None:
        return
    if Path(calibration).is_file() and not is_records(calibration):
        raise ConfigError(
            f"--text-field {text_field} names a field of records, and --calibration "
            f"{calibration} is a text file: give a .jsonl, .parquet or .arrow file, or drop "
            "--text-field"
        )


def calibration_windows(
    ids: list[int], samples: int, seq: int, seed: int, source: str
) -> torch.Tensor:
    """``samples`` windows (rows) of ``seq`` tokens: distinct non-overlapping windows of the text,
    picked at random by ``seed`` and kept in text order."""
    import torch

    need = samples * seq
    if len(ids) < need:
        raise SparsetoolError(
            f"--calibration {source}: {plural(len(ids), 'token')} for this model's tokenizer, but "
            f"--samples {samples} x --seq {seq} needs {need:,}; give more text or lower "
            "--samples or --seq"
        )
    n = len(ids) // seq
    pick = _order(n, seed)[:samples].sort().values
    t = torch.tensor(ids[: n * seq], dtype=torch.long).view(n, seq)
    return t[pick]


def unpicked_windows(ids: list[int], samples: int, seq: int, seed: int, count: int) -> torch.Tensor:
    """Up to ``count`` more windows of ``seq`` tokens of the text, none of them among the
    ``samples`` :func:`calibration_windows` picks with ``seed`` (the next ones of its random
    order, kept in text order): text the calibration never ran, to score what it made on. Empty
    when the text holds no more."""
    import torch

    n = len(ids) // seq
    pick = _order(n, seed)[samples : samples + count].sort().values
    t = torch.tensor(ids[: n * seq], dtype=torch.long).view(n, seq)
    return t[pick]


def _order(n: int, seed: int) -> torch.Tensor:
    import torch

    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


def window_length(seq: int | None, context: int, source: object) -> tuple[int, str | None]:
    """The calibration windows' length: ``seq`` as asked (refused beyond the model's
    ``context``), or None: :data:`DEFAULT_SEQ`, or the context when shorter (with a note)."""
    if seq is None:
        seq = min(DEFAULT_SEQ, context)
        if seq < DEFAULT_SEQ:
            return seq, (
                f"calibration windows of {seq} tokens, the model's context "
                f"(shorter than the default --seq {DEFAULT_SEQ})"
            )
        return seq, None
    if seq > context:
        raise SparsetoolError(
            f"--seq {seq}: {source} takes at most {context} "
            f"tokens at once; use --seq {context} or less"
        )
    return seq, None


# ---------------------------------------------------------------------------------- the pass
class Step:
    """One block of a :class:`BlockPass`, loaded: its index, the windows' inputs to it
    (``calls``) and, once run, their outputs (``outputs``: the next block's inputs)."""

    def __init__(self, model: BlockModel, index: int, calls: list[Call]):
        self.model, self.index, self.calls = model, index, calls
        self.outputs: list[Call] | None = None

    def run(self) -> list[Call]:
        """Run the block (as it now is) on every window; its outputs replace any earlier run's."""
        self.outputs = None  # an earlier run's outputs go before the new ones are made
        self.outputs = [c.passed(self.model.run_block(self.index, c)) for c in self.calls]
        return self.outputs

    @property
    def hidden(self) -> list[torch.Tensor]:
        """The outputs' hidden states (the block is run first if it was not)."""
        return [c.hidden for c in (self.outputs if self.outputs is not None else self.run())]


class BlockPass:
    """The calibration windows through ``model`` block by block, up to block ``last`` (default:
    every block): iterating yields a :class:`Step` per block with the block loaded; after the
    caller is done with it, the block is run for the next one's inputs if the caller did not
    (the last block too when ``final``, for :attr:`calls` after the pass), then released, and
    ``progress(label, done, total)`` is told. The pass runs without gradients."""

    def __init__(
        self,
        model: BlockModel,
        windows: torch.Tensor,
        label: str,
        progress: Progress | None = None,
        *,
        last: int | None = None,
        final: bool = False,
    ):
        self.model, self.windows, self.label, self.progress = model, windows, label, progress
        self.last = len(model.blocks) - 1 if last is None else last
        self.final = final
        self.calls: list[Call] = []  # after the pass (``final``): the last block's outputs

    def __iter__(self) -> Iterator[Step]:
        import torch

        model = self.model
        with torch.no_grad():
            calls = model.capture([row.unsqueeze(0) for row in self.windows])
            for i in range(self.last + 1):
                model.load_block(i)
                step = Step(model, i, calls)
                yield step
                if step.outputs is None and (i < self.last or self.final):
                    step.run()
                calls = step.outputs if step.outputs is not None else []
                step.calls, step.outputs = [], None  # the caller's name for it holds nothing
                del step
                model.release_block(i)
                if self.progress:
                    self.progress(self.label, i + 1, self.last + 1)
            self.calls = calls


# ---------------------------------------------------------------------------------- memory
def activation_bytes(
    samples: int, seq: int, width: int, itemsize: int, block_work: int, routed: int
) -> int:
    """The calibration windows' hidden states entering and leaving a block, the block's own
    working memory (``block_work``) and the experts' routed inputs (``routed``)."""
    hidden = samples * seq * width * itemsize
    return BLOCK_ENDS * hidden + block_work + routed


def routed_bytes(seq: int, experts_per_token: int, width: int, widest_input: int) -> int:
    """A window's routed inputs of every expert, held while their statistics are added: the
    hidden states each token's experts read and their gated products (``widest_input`` wide),
    as they are and scaled by the routing weights (float32 at most)."""
    return ROUTED_COPIES * seq * experts_per_token * (width + widest_input) * FLOAT32


def pass_memory(
    model: BlockModel,
    samples: int,
    seq: int,
    max_memory: int | None,
    *,
    routed: int = 0,
    held: int = 0,
) -> MemoryPlan:
    """The pass's part of a run's plan: the process as it is, the largest block (or the outer
    weights), the windows' hidden states at both ends of a block with one window's working
    memory, ``routed`` (:func:`routed_bytes`) and ``held`` (more hidden states a command keeps);
    ``statistics`` is left for the command to add."""
    total, source = budget(max_memory)
    return MemoryPlan(
        fixed=process_memory(),
        weights=max(model.largest_block_bytes, model.bytes_of(model.outer)),
        activations=activation_bytes(
            samples, seq, model.width, model.dtype.itemsize, model.block_work_bytes(1, seq), routed
        )
        + held,
        statistics=0,
        budget=total,
        budget_source=source,
    )


def hidden_bytes(model: BlockModel, samples: int, seq: int) -> int:
    """One set of the windows' hidden states (a block's inputs, or its outputs)."""
    return samples * seq * model.width * model.dtype.itemsize


# ---------------------------------------------------------------------------------- experts
def is_experts(module: torch.nn.Module) -> bool:
    """transformers' fused experts: 3-D parameters, one matrix per expert, and a down projection."""
    return hasattr(module, "down_proj") and any(
        p.ndim == 3 for p in module.parameters(recurse=False)
    )


def routing_of(args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(hidden states, chosen experts, routing weights) of a call of an experts module, passed by
    position or by name (each family names them its own way), each with one row per token."""
    hidden, index, weights = (list(args) + list(kwargs.values()))[:3]
    tokens = hidden.numel() // hidden.shape[-1]
    return hidden.reshape(tokens, -1), index.reshape(tokens, -1), weights.reshape(tokens, -1)


def routed_inputs(
    experts: torch.nn.Module,
    e: int,
    hidden: torch.Tensor,
    index: torch.Tensor,
    weights: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The hidden states (tokens, d) routed to expert ``e`` and their routing weights (tokens,),
    from a block's hidden states, chosen experts (tokens, k) and weights (tokens, k)."""
    tokens, slot = (index == e).nonzero(as_tuple=True)
    return hidden[tokens], weights[tokens, slot].to(hidden.dtype)


def gated_product(experts: torch.nn.Module, e: int, x: torch.Tensor) -> torch.Tensor:
    """What expert ``e`` of transformers' fused ``experts`` module hands its down projection for
    inputs ``x``: its gate and up projections (with their biases, in the module's orientation)
    through the module's own gate (``_apply_gate``) or activation."""
    m: Any = experts  # each family's own attributes
    gate = getattr(m, "has_gate", True)
    weight = (m.gate_up_proj if gate else m.up_proj)[e]
    out = x @ weight if getattr(m, "is_transposed", False) else x @ weight.T
    if getattr(m, "has_bias", False):
        out = out + (m.gate_up_proj_bias if gate else m.up_proj_bias)[e]
    return m._apply_gate(out) if gate else m.act_fn(out)
