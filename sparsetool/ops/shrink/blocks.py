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

The output keeps the input's layout: the removed blocks' tensors gone, the others renumbered
``0 .. L-N-1`` and copied byte for byte, ``config.json``'s layer count lowered and its per-layer
lists (``layer_types``, written out in full when transformers derives it from a pattern) cut to
the blocks kept.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from sparsetool.checkpoint import Checkpoint
from sparsetool.checkpoint.format import TensorSpec
from sparsetool.checkpoint.provenance import provenance_metadata
from sparsetool.checkpoint.writer import write_checkpoint
from sparsetool.errors import SparsetoolError, UsageError
from sparsetool.models.blocks import BlockModel
from sparsetool.models.open import open_model
from sparsetool.ops.shrink.inputs import check_output, model_config, record_sizes
from sparsetool.ops.shrink.options import ShrinkOptions, ShrinkResult
from sparsetool.ops.shrink.windows import shrink_windows
from sparsetool.ops.text import read_text
from sparsetool.util.progress import Progress

__all__ = ["LAYER_COUNT_KEYS", "plan_blocks", "shrink_blocks"]

LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
NEEDS = "shrink removes blocks of causal language models (Hugging Face directories)"


def plan_blocks(path: str | Path, opts: ShrinkOptions) -> tuple[int, int]:
    """(blocks in the model, blocks removed), from config.json alone; a usage error when that
    removes none or every one."""
    opts.validate()
    path = Path(path)
    _config, cfg = model_config(path, NEEDS)
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
    path: str | Path, out: str | Path, opts: ShrinkOptions, *, progress: Progress | None = None
) -> ShrinkResult:
    """Remove ``opts.blocks`` whole blocks of the model at ``path`` into ``out``; see the module
    docstring."""
    path, out = Path(path), Path(out)
    total, n = plan_blocks(path, opts)
    check_output(path, out)
    assert opts.calibration is not None
    text = read_text(opts.calibration, "--calibration")
    model = open_model(path, opts.dtype, opts.device, needs=NEEDS, attention="eager")
    result = ShrinkResult(output=out, options=opts)
    try:
        if len(model.blocks) != total:
            raise SparsetoolError(f"{path}: config.json says {total} blocks, the model has "
                                  f"{len(model.blocks)}")  # fmt: skip
        bi, angular = _scores(model, opts, text, n, result, progress)
        if opts.block_criterion == "bi":
            removed = sorted(sorted(range(total), key=lambda i: (bi[i], -i))[:n])
        else:
            start = min(range(len(angular)), key=lambda s: (angular[s], -s))
            removed = list(range(start, start + n))
        kept = [i for i in range(total) if i not in removed]
        result.blocks = {
            "before": total,
            "after": total - n,
            "criterion": opts.block_criterion,
            "removed": removed,
            "kept": kept,
            "bi": [round(x, 6) for x in bi],
            "angular": [round(x, 6) for x in angular],
        }
        renames = _renames(model, kept)
        metadata = provenance_metadata(
            model.ckpt.metadata(), {"command": "shrink", **opts.record(), "blocks": result.blocks}
        )
        cfg = model.module.config
        with write_checkpoint(
            model.ckpt,
            out,
            metadata_extra=metadata,
            config_transform=lambda config: _config(config, cfg, total, kept),
        ) as cw:
            result.left_out = list(cw.left_out)
            _write(model.ckpt, cw, renames)
        ckpt = model.ckpt
        gone = sum(lt.numel for lt in ckpt.logical if renames.get(lt.name, lt.name) is None)
        record_sizes(result, ckpt, out, gone)
    finally:
        model.close()
    return result


def _scores(
    model: BlockModel,
    opts: ShrinkOptions,
    text: str,
    n: int,
    result: ShrinkResult,
    progress: Progress | None,
) -> tuple[list[float], list[float]]:
    """Every block's influence, and every run of ``n`` blocks' angular distance."""
    windows = shrink_windows(model, opts, text, result)
    total = len(model.blocks)
    bi: list[float] = []
    angular: list[float] = []
    held: list[list[torch.Tensor]] = []  # the inputs of the last n blocks (angular)
    with torch.no_grad():
        calls = model.capture([row.unsqueeze(0) for row in windows])
        for i in range(total):
            model.load_block(i)
            outs = [model.run_block(i, c) for c in calls]
            model.release_block(i)
            ins = [c.hidden for c in calls]
            bi.append(1.0 - _mean_cos(ins, outs, angle=False))
            if opts.block_criterion == "angular":
                held.append(ins)
                if len(held) > n:
                    held.pop(0)
                if i + 1 >= n:
                    angular.append(_mean_cos(held[0], outs, angle=True))
            calls = [c.passed(h) for c, h in zip(calls, outs)]
            if progress:
                progress("score", i + 1, total)
    return bi, angular


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


def _write(ckpt: Checkpoint, cw, renames: dict[str, str | None]) -> None:
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
