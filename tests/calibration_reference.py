"""An independent float64 reference of calibration pruning, for tests that check sparsetool's
output on any CPU: transformers runs the model in float64 (eager attention), each block's linear
layers are pruned from the inputs they see once the blocks before them are pruned (the block itself
still dense, as sparsetool gathers a block's statistics), and the two methods are written out here
from their papers with numpy, column by column, sharing no code with ``sparsetool.masks``.

- Wanda (Sun et al. 2023): score ``|W_ij| * ||X_j||``, each output row keeps its highest scores
  (its share of the tensor's pruned count, the first rows one more), N:M along the input.
- SparseGPT (Frantar and Alistarh 2023): ``H = X^T X``, never-active inputs ``H_jj = 1``, dampening
  ``0.01 * mean(diag H)``, the upper Cholesky factor ``U`` of ``H^-1``; blocks of 128 columns
  choose their mask when reached by ``w^2 / U_jj^2`` (their share of the pruned count, in
  proportion to their size), N:M every M columns; each pruned column's error
  ``(w - q) / U_jj`` is spread over the columns after it by ``U_j,j:``.

Ties keep the lower index (sparsetool's rule), though in float64 they do not occur here.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

BLOCKSIZE = 128
DAMPENING = 0.01


def reference_prune(
    src: Path,
    text: str,
    method: str,
    *,
    sparsity: float | None = None,
    nm: tuple[int, int] | None = None,
    samples: int,
    seq: int,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Every targeted ``.weight`` of the model in ``src`` (its blocks' linear layers), pruned in
    float64 as sparsetool's ``prune --method`` would: name -> weight in its stored orientation."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        src, dtype=torch.float64, attn_implementation="eager"
    ).eval()
    tok = transformers.AutoTokenizer.from_pretrained(src)
    ids = tok(text)["input_ids"]
    n = len(ids) // seq
    pick = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:samples].sort().values
    windows = torch.tensor(ids[: n * seq], dtype=torch.long).view(n, seq)[pick]

    blocks: dict[int, list[str]] = {}
    for name, module in model.named_modules():
        found = re.search(r"\.(?:h|layers)\.(\d+)\.", name + ".")
        if found and _is_linear(module) and "lm_head" not in name:
            blocks.setdefault(int(found.group(1)), []).append(name)

    out: dict[str, np.ndarray] = {}
    for b in sorted(blocks):
        seen: dict[str, list[torch.Tensor]] = {name: [] for name in blocks[b]}
        hooks = [
            model.get_submodule(name).register_forward_pre_hook(_recorder(seen[name]))
            for name in blocks[b]
        ]
        with torch.no_grad():
            model(windows)
        for h in hooks:
            h.remove()
        for name in blocks[b]:
            module = model.get_submodule(name)
            x = torch.cat(seen[name]).numpy()
            conv = type(module).__name__ == "Conv1D"  # GPT-2 stores (in, out)
            w = module.weight.detach().numpy()
            w = w.T if conv else w
            if method == "wanda":
                pruned = wanda(w, x, sparsity=sparsity, nm=nm)
            else:
                pruned = sparsegpt(w, x, sparsity=sparsity, nm=nm)
            stored = pruned.T if conv else pruned
            with torch.no_grad():
                module.weight.copy_(torch.from_numpy(np.ascontiguousarray(stored)))
            out[f"{name}.weight"] = stored
    return out


def _recorder(into: list[torch.Tensor]):
    """A forward pre-hook appending its module's input, flattened to (tokens, in), to ``into``."""

    def hook(_module, args):
        into.append(args[0].reshape(-1, args[0].shape[-1]))

    return hook


def _is_linear(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D"


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` highest of ``scores`` (any shape), ties to the lower flat index."""
    flat = scores.reshape(-1)
    order = np.argsort(-flat, kind="stable")
    kept = np.zeros(flat.shape, dtype=bool)
    kept[order[:k]] = True
    return kept.reshape(scores.shape)


def _nm(scores: np.ndarray, n: int, m: int) -> np.ndarray:
    """N:M along the last axis: every ``m`` consecutive scores of a row keep their ``n``
    highest."""
    rows, cols = scores.shape
    kept = np.zeros(scores.shape, dtype=bool)
    for r in range(rows):
        for g in range(0, cols, m):
            kept[r, g : g + m] = _top(scores[r, g : g + m], n)
    return kept


def wanda(w: np.ndarray, x: np.ndarray, *, sparsity=None, nm=None) -> np.ndarray:
    """``w`` (out, in) pruned by Wanda from inputs ``x`` (tokens, in); kept weights unchanged."""
    scores = np.abs(w) * np.sqrt((x * x).sum(0))[None, :]
    if nm is not None:
        kept = _nm(scores, *nm)
    else:
        rows, cols = w.shape
        prune = round(sparsity * w.size)
        base, extra = divmod(prune, rows)
        kept = np.stack([_top(scores[r], cols - base - (r < extra)) for r in range(rows)])
    return np.where(kept, w, 0.0)


def sparsegpt(w: np.ndarray, x: np.ndarray, *, sparsity=None, nm=None) -> np.ndarray:
    """``w`` (out, in) pruned by SparseGPT from inputs ``x`` (tokens, in); the kept weights
    updated."""
    rows, cols = w.shape
    h = x.T @ x
    d = np.diag(h).copy()
    d[d == 0] = 1.0
    h[np.diag_indices(cols)] = d + DAMPENING * d.mean()
    u = np.linalg.cholesky(np.linalg.inv(h)).T  # upper: H^-1 = U^T U
    w = w.copy()
    prune = None if nm is not None else round(sparsity * w.size)
    before = 0
    for i1 in range(0, cols, BLOCKSIZE):
        i2 = min(i1 + BLOCKSIZE, cols)
        kept = np.zeros((rows, i2 - i1), dtype=bool)
        if prune is not None:
            upto = (2 * prune * i2 * rows + w.size) // (2 * w.size)  # pruned up to this block
            share, before = upto - before, upto
            kept = _top(w[:, i1:i2] ** 2 / np.diag(u)[i1:i2] ** 2, kept.size - share)
        for i in range(i1, i2):
            if nm is not None and (i - i1) % nm[1] == 0:
                g = slice(i, i + nm[1])
                kept[:, i - i1 : i - i1 + nm[1]] = _nm(w[:, g] ** 2 / np.diag(u)[g] ** 2, *nm)
            q = np.where(kept[:, i - i1], w[:, i], 0.0)
            err = (w[:, i] - q) / u[i, i]
            w[:, i:] -= np.outer(err, u[i, i:])
            w[:, i] = q
    return w
