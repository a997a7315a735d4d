"""``shrink --blocks N``: remove whole transformer blocks, chosen on calibration text.

The calibration windows run through the model block by block (one block in memory, its weights
read from the checkpoint when its turn comes), and every block's input and output are compared
over every calibration token:

- ``bi`` (ShortGPT's block influence): block ``i`` scores ``1 - mean_t cos(x_i(t), x_{i+1}(t))``,
  ``x_i`` its input and ``x_{i+1}`` its output; the ``N`` lowest go;
- ``angular`` (Gromov et al., "The Unreasonable Ineffectiveness of the Deeper Layers"): each run
  of ``N`` consecutive blocks starting at ``l`` scores ``mean_t arccos(cos(x_l(t), x_{l+N}(t))) /
  pi``; the run of the smallest goes (the paper takes each sequence's last token; here every
  token counts). The inputs of the last ``N`` blocks are held for it.

Reconstruction (the default; ``--no-reconstruct`` leaves it out): each removed run of consecutive
blocks gets ReplaceMe's linear map, fitted by least squares in a second pass of the text through
the original model (:class:`sparsetool.ops.shrink.refit.RunMap`) and folded into the down
projection of the kept block before the run. The map's damping pulls it toward the identity (the
blocks just removed) and is chosen on held-back calibration windows; a run no map improves there
is left as removed (:func:`sparsetool.ops.shrink.refit.choose_map`). A run that starts at block 0
has no block before it to fold into, and a block whose MLP output passes a norm before the
residual (Gemma-3's ``post_feedforward_layernorm``) cannot take the fold: both are left as
removed, and the result says so.

The output keeps the input's layout: the removed blocks' tensors gone, the others renumbered
``0 .. L-N-1`` and copied byte for byte (a folded down projection written anew),
``config.json``'s layer count lowered and its per-layer lists (``layer_types``, written out in
full when transformers derives it from a pattern) cut to the blocks kept.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from sparsetool.checkpoint import Checkpoint
from sparsetool.checkpoint.format import TensorSpec
from sparsetool.checkpoint.writer import CheckpointWriter
from sparsetool.errors import SparsetoolError, UsageError
from sparsetool.models.blocks import BlockModel
from sparsetool.ops.calibration import BlockPass
from sparsetool.ops.shrink.inputs import model_config
from sparsetool.ops.shrink.kind import Shrinking, run_kind
from sparsetool.ops.shrink.memory import blocks_held, blocks_statistics
from sparsetool.ops.shrink.options import ShrinkOptions
from sparsetool.ops.shrink.refit import DAMPINGS, RunMap, choose_map, held_windows, is_held
from sparsetool.ops.shrink.results import BlockMaps, BlocksRemoved, FoldedMap, ShrinkResult
from sparsetool.ops.shrink.windows import shrink_windows
from sparsetool.util.memory import MemoryPlan
from sparsetool.util.progress import Progress
from sparsetool.util.threads import torch_threads

__all__ = ["LAYER_COUNT_KEYS", "BlocksKind", "plan_blocks", "shrink_blocks", "write_renamed"]

LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
NEEDS = "shrink removes blocks of causal language models (Hugging Face directories)"


def plan_blocks(path: str | Path, opts: ShrinkOptions) -> tuple[int, int]:
    """(blocks in the model, blocks removed), from config.json alone; a usage error when that
    removes none or every one."""
    opts.validate()
    path = Path(path)
    _config, cfg = model_config(path, NEEDS)
    return _counts(opts, path, cfg)


def _counts(opts: ShrinkOptions, path: Path, cfg: Any) -> tuple[int, int]:
    total = next((v for k in LAYER_COUNT_KEYS if isinstance(v := getattr(cfg, k, None), int)), None)
    if not total:
        raise SparsetoolError(f"{path}/config.json: no layer count ({', '.join(LAYER_COUNT_KEYS)})")
    assert opts.blocks is not None
    b = opts.blocks
    whole = b >= 1
    removed = int(b) if whole else round(b * total)
    rule = "" if whole else f" (round({b:g} x {total}) = {removed})"
    if total == 1:
        raise UsageError(
            f"--blocks {b:g}: {path} has only 1 block, which shrink keeps; --blocks cannot "
            "shrink it (--ffn, --heads or --hidden can)"
        )
    if removed < 1:
        raise UsageError(
            f"--blocks {b:g} removes none of {path}'s {total} blocks{rule}; remove at least 1 "
            "(--blocks 1)"
        )
    if removed > total:
        raise UsageError(
            f"--blocks {b:g}: {path} has only {total} blocks; remove at most {total - 1}"
        )
    if removed == total:
        raise UsageError(
            f"--blocks {b:g} removes all of {path}'s {total} blocks{rule}; remove at most "
            f"{total - 1}"
        )
    return total, removed


def shrink_blocks(
    path: str | Path,
    out: str | Path,
    opts: ShrinkOptions,
    *,
    progress: Progress | None = None,
    on_plan: Callable[[MemoryPlan], None] | None = None,
) -> ShrinkResult:
    """Remove ``opts.blocks`` whole blocks of the model at ``path`` into ``out``; see the module
    docstring."""
    return run_kind(BlocksKind(opts), path, out, opts, progress=progress, on_plan=on_plan)


class BlocksKind:
    """``--blocks`` as a :class:`~sparsetool.ops.shrink.kind.ShrinkKind`."""

    key = "blocks"
    needs = NEEDS

    def __init__(self, opts: ShrinkOptions):
        self.opts = opts
        self.path = Path()
        self.total = self.n = 0

    def plan(self, path: Path, config: dict[str, Any], cfg: Any) -> None:
        self.path = path
        self.total, self.n = _counts(self.opts, path, cfg)

    def choose(
        self,
        model: BlockModel,
        text: str | None,
        result: ShrinkResult,
        held: contextlib.ExitStack,
        progress: Progress | None,
        on_plan: Callable[[MemoryPlan], None] | None,
    ) -> Shrinking:
        opts, total, n = self.opts, self.total, self.n
        assert text is not None
        if len(model.blocks) != total:
            raise SparsetoolError(f"{self.path}: config.json says {total} blocks, the model has "
                                  f"{len(model.blocks)}")  # fmt: skip
        windows = shrink_windows(
            model,
            opts,
            text,
            result,
            statistics=_statistics(model, opts, n) if opts.reconstruct else 0,
            held=blocks_held(n, opts.block_criterion == "angular", opts.reconstruct),
            on_plan=on_plan,
        )
        bi, angular = _scores(model, opts, windows, n, progress)
        if opts.block_criterion == "bi":
            removed = sorted(sorted(range(total), key=lambda i: (bi[i], -i))[:n])
        else:
            start = min(range(len(angular)), key=lambda s: (angular[s], -s))
            removed = list(range(start, start + n))
        kept = [i for i in range(total) if i not in removed]
        result.blocks = record = BlocksRemoved(
            before=total,
            after=total - n,
            criterion=opts.block_criterion,
            removed=removed,
            kept=kept,
            bi=[round(x, 6) for x in bi],
            angular=[round(x, 6) for x in angular],
        )
        renames = _renames(model, kept)
        values: dict[str, torch.Tensor] = {}
        if opts.reconstruct:
            record.reconstruct = _replace_runs(model, windows, removed, values, result, progress)
        cfg = model.module.config
        ckpt = model.ckpt
        return Shrinking(
            record=record.to_json(),
            config=lambda config: _config(config, cfg, total, kept),
            write=lambda cw: write_renamed(ckpt, cw, renames, values),
            removed=lambda: sum(
                lt.numel for lt in ckpt.logical if renames.get(lt.name, lt.name) is None
            ),
        )


def _statistics(model: BlockModel, opts: ShrinkOptions, n: int) -> int:
    """ReplaceMe's maps at their most (:func:`~sparsetool.ops.shrink.memory.blocks_statistics`):
    as many runs as ``n`` removed blocks can make (one, for angular distance), each folding into
    a down projection of the largest FFN."""
    runs = 1 if opts.block_criterion == "angular" else n  # each map is solved as its run ends
    ends = ("mlp.down_proj.weight", "mlp.c_proj.weight")
    downs = [lt for lt in model.ckpt.logical if lt.name.endswith(ends)]
    widest = max((lt.numel // model.width for lt in downs), default=0)
    stored = max((lt.dtype.itemsize for lt in downs), default=4)
    return blocks_statistics(width=model.width, ffn=widest, runs=runs, stored=stored)


def _scores(
    model: BlockModel,
    opts: ShrinkOptions,
    windows: torch.Tensor,
    n: int,
    progress: Progress | None,
) -> tuple[list[float], list[float]]:
    """Every block's influence, and every run of ``n`` blocks' angular distance."""
    bi: list[float] = []
    angular: list[float] = []
    held: list[list[torch.Tensor]] = []  # the inputs of the last n blocks (angular)
    for step in BlockPass(model, windows, "score", progress):
        i = step.index
        ins = [c.hidden for c in step.calls]
        outs = step.hidden
        bi.append(1.0 - _mean_cos(ins, outs, angle=False))
        if opts.block_criterion == "angular":
            held.append(ins)
            if len(held) > n:
                held.pop(0)
            if i + 1 >= n:
                angular.append(_mean_cos(held[0], outs, angle=True))
    return bi, angular


def _runs(removed: list[int]) -> list[list[int]]:
    """``removed`` (sorted) as runs of consecutive blocks.

    >>> _runs([2, 3, 7, 9, 10])
    [[2, 3], [7], [9, 10]]
    """
    runs: list[list[int]] = []
    for i in removed:
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def _down_projection(model: BlockModel, i: int) -> tuple[str, bool] | None:
    """Block ``i``'s FFN down projection (module path, whether a GPT-2 Conv1D), or None when its
    output reaches the residual through anything but the identity (a post-FFN norm)."""
    block = model.block_list[i]
    names = dict(block.named_modules())
    if any("post_feedforward" in n for n in names):
        return None
    for path, conv1d in (("mlp.down_proj", False), ("mlp.c_proj", True)):
        if path in names:
            return f"{model.block_prefix}.{i}.{path}", conv1d
    return None


def _replace_runs(
    model: BlockModel,
    windows: torch.Tensor,
    removed: list[int],
    values: dict[str, torch.Tensor],
    result: ShrinkResult,
    progress: Progress | None,
) -> BlockMaps:
    """ReplaceMe's map for each removed run, fitted in one more pass of the calibration windows
    through the original model (up to the last removed block) and folded into the down
    projection before the run (``values``: stored name -> its new tensor); the record."""
    runs = _runs(removed)
    targets: dict[int, tuple[list[int], str, bool]] = {}  # block before a run -> its fold
    samples = len(windows)
    record = BlockMaps(
        "ReplaceMe: least squares, folded into the down projection, damped toward the identity; "
        "the damping chosen on the held-back windows",
        list(DAMPINGS),
        held_windows(samples),
    )
    for run in runs:
        before = run[0] - 1
        found = _down_projection(model, before) if before >= 0 else None
        if found is None:
            why = (
                "it starts at block 0: no block before it to fold a map into"
                if before < 0
                else f"block {before}'s MLP output passes a norm before the residual"
            )
            record.not_refit.append({"run": run, "why": why})
            result.notes.append(f"removed blocks {_span(run)} are not refit: {why}")
            continue
        targets[before] = (run, *found)
    if not targets:
        return record
    maps: dict[int, tuple[RunMap, RunMap]] = {b: (RunMap(), RunMap()) for b in targets}
    open_: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}  # run end -> (m, h)
    ends = {run[-1]: before for before, (run, _p, _c) in targets.items()}
    last = max(ends)
    for step in BlockPass(model, windows, "fit", progress, last=last):
        i = step.index
        seen: list[torch.Tensor] = []
        handle = None
        if i in targets:
            handle = model.module.get_submodule(targets[i][1]).register_forward_hook(_keeper(seen))
        try:
            outs = step.hidden
        finally:
            if handle is not None:
                handle.remove()
        if i in targets:
            open_[targets[i][0][-1]] = (seen, outs)
        if i in open_:  # the run ends here: its map is fitted, solved and folded at once
            (ms, hs), before = open_.pop(i), ends[i]
            fit, held = maps.pop(before)
            for w, (m, h, after) in enumerate(zip(ms, hs, outs)):
                (held if is_held(w, samples) else fit).add(m, h, after)
            del ms, hs
            run, path, conv1d = targets[before]
            choice = choose_map(fit, held)
            del fit, held
            if choice.t is not None:
                _fold(model, path, conv1d, choice.t, values)
            else:
                result.notes.append(
                    f"removed blocks {_span(run)} are not refit: no map beat the blocks just "
                    "removed on the held-back calibration windows"
                    if choice.held_before is not None
                    else f"removed blocks {_span(run)} are not refit: one calibration window, "
                    "none held back to check a map on; give --samples 2 or more"
                )
            record.maps.append(
                FoldedMap(
                    run,
                    before,
                    choice.error_before,
                    choice.error_after,
                    choice.damping,
                    choice.held_before,
                    choice.held_after,
                    kept_plain=choice.t is None,
                )
            )
        del outs
    return record


def _fold(
    model: BlockModel, path: str, conv1d: bool, t: torch.Tensor, values: dict[str, torch.Tensor]
) -> None:
    """``W_down <- T^T W_down`` (a Conv1D stores ``W^T``: ``W^T T``), ``b <- T^T b``."""
    for kind in ("weight", "bias"):
        pieces = model.sources.get(f"{path}.{kind}")
        if not pieces:
            continue
        if len(pieces) != 1 or pieces[0].index:
            raise SparsetoolError(f"{model.path}: {path}.{kind} is merged from several tensors; "
                                  "shrink cannot fold a map into it")  # fmt: skip
        stored = pieces[0].stored
        w = model.ckpt.read_stored(stored)
        x = w.to(torch.float64)
        new = x @ t if conv1d and kind == "weight" else t.T @ x
        values[stored] = new.to(w.dtype).contiguous()


def _keeper(into: list[torch.Tensor]):
    """A forward hook appending its module's output to ``into``."""

    def keep(_module, _args, out) -> None:
        into.append(out.detach())

    return keep


def _span(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"


@torch_threads(1)  # a sum over every token: the same bits whatever --threads
def _mean_cos(a: list[torch.Tensor], b: list[torch.Tensor], angle: bool) -> float:
    """The mean over every token of the cosine of ``a`` and ``b`` (or of the angle / pi)."""
    total, count = 0.0, 0
    for x, y in zip(a, b):
        x, y = x.reshape(-1, x.shape[-1]).float(), y.reshape(-1, y.shape[-1]).float()
        cos = torch.nn.functional.cosine_similarity(x, y, dim=-1).clamp(-1, 1).double()
        total += float((torch.arccos(cos) / math.pi if angle else cos).sum())
        count += cos.numel()
    return total / max(count, 1)


def _renames(model: BlockModel, kept: list[int]) -> dict[str, str | None]:
    """Each checkpoint tensor of a block (any stored part) -> its name in the output, or None for
    a removed block's; tensors outside the blocks are not listed (copied as they are)."""
    new = {old: i for i, old in enumerate(kept)}
    prefix, position = _stored_prefix(model)
    out: dict[str, str | None] = {}
    for lt in model.ckpt.logical:
        for name in (lt.name, *lt.stored):
            parts = name.split(".")
            if len(parts) <= position or ".".join(parts[:position]) != prefix:
                continue
            if not parts[position].isdigit():
                continue
            i = int(parts[position])
            if i not in new:
                out[name] = None
                continue
            parts[position] = str(new[i])
            out[name] = ".".join(parts)
    return out


def _stored_prefix(model: BlockModel) -> tuple[str, int]:
    """The checkpoint's name for the list of blocks (``model.layers``, GPT-2's ``h``) and the
    dotted position of the block number, seen in block 0's first tensor."""
    name = model.blocks[0][0]
    stored = model.sources[name][0].stored
    parts = stored.split(".")
    tail = name[len(model.block_prefix) + 1 :].split(".")  # "0", then the parameter's own path
    position = len(parts) - len(tail)
    if position < 0 or parts[position] != "0" or parts[position + 1 :] != tail[1:]:
        raise SparsetoolError(
            f"{model.path}: tensor {stored!r} does not name its block as the model does "
            f"({name!r}); shrink cannot renumber the blocks"
        )
    return ".".join(parts[:position]), position


def write_renamed(
    ckpt: Checkpoint,
    cw: CheckpointWriter,
    renames: dict[str, str | None],
    values: dict[str, torch.Tensor] | None = None,
) -> None:
    """Every stored tensor of ``ckpt`` into ``cw``, renamed by ``renames`` (None: left out; a name
    not listed: kept) and copied byte for byte; one in ``values`` written from there (a folded
    down projection). With neither, a byte-for-byte copy."""
    values = values or {}
    for shard in ckpt.shards:
        specs, copies = [], []
        for lt in ckpt.logical_in(shard):
            for part in lt.stored:
                target = renames.get(part, part)
                if target is None:
                    continue
                e = ckpt.entry(part)
                specs.append(TensorSpec(target, e.st_dtype, tuple(e.shape)))
                copies.append((target, part))
        with cw.shard(shard, specs) as sw:
            for target, part in copies:
                if part in values:
                    sw.write(target, values[part])
                else:
                    sw.copy_stored(target, ckpt, part)


def _config(config: dict, cfg, total: int, kept: list[int]) -> dict:
    """config.json with the layer count lowered and its per-layer lists cut to the kept blocks
    (``layer_types`` written out when transformers derived it from a pattern)."""
    for k in LAYER_COUNT_KEYS:
        if config.get(k) == total:
            config[k] = len(kept)
    for k, v in list(config.items()):
        if isinstance(v, list) and len(v) == total:
            config[k] = [v[i] for i in kept]
    types = getattr(cfg, "layer_types", None)
    if isinstance(types, list) and len(types) == total and "layer_types" not in config:
        config["layer_types"] = [types[i] for i in kept]
    if isinstance(config.get("mlp_only_layers"), list):
        config["mlp_only_layers"] = [kept.index(i) for i in config["mlp_only_layers"] if i in kept]
    return config
