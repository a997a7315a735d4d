"""A checkpoint as a language model to score text with: sparsetool's GPT or a Hugging Face causal LM.

Both kinds come back as an :class:`LM`: a tokenizer (text -> token ids), a forward pass (ids ->
logits) and the longest window the model takes. Weights are always decoded by sparsetool itself
(``read_init_checkpoint`` for our GPT, as ``train --init`` does; ``sparsetool.load`` for Hugging Face
directories), so ``nan`` and ``bitmask`` encodings, which transformers cannot read, score exactly
like ``zeros``. transformers is imported only for Hugging Face directories (the ``hf`` extra).

No code from the checkpoint directory ever runs: the config's ``auto_map`` (classes in ``.py``
files beside the weights) is dropped, transformers is told ``trust_remote_code=False`` (without it,
it asks on the terminal whether to run such code), and no module named in a config is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from sparsetool.checkpoint import open_checkpoint
from sparsetool.checkpoint.zeros import count_nonzero
from sparsetool.errors import SparsetoolError
from sparsetool.targets import is_floating, plan_targets
from sparsetool.train.hf import HF_EXTRA, MAX_DEFAULT_SEQ, match_weights  # noqa: F401 (re-exported)
from sparsetool.train.hf import context_of as _context
from sparsetool.train.hf import hf_config as _hf_config
from sparsetool.train.hf import import_transformers as _import_transformers
from sparsetool.train.hf import load_tokenizer as _tokenizer

__all__ = ["LM", "Model", "Encoded", "DTYPES", "open_lm", "load_model", "read_text"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class Encoded:
    """Token ids of a text, and how many UTF-8 bytes of it the first ``k`` tokens cover."""

    ids: list[int]
    byte_ends: Callable[[int], int]  # k tokens -> bytes of text they cover


@dataclass
class LM:
    """A model ready to score: ``logits(ids (B, T)) -> (B, T, V)`` in eval mode, no grad."""

    kind: str  # "sparsetool-gpt" | "huggingface"
    context: int  # longest window the model takes
    encode: Callable[[str], Encoded]
    logits: Callable[[torch.Tensor], torch.Tensor]
    numel: int  # floating-point parameters in the checkpoint (a tied head counted once)
    nonzero: int
    targeted_numel: int
    targeted_nonzero: int

    @property
    def targeted_sparsity(self) -> float:
        return 1.0 - self.targeted_nonzero / self.targeted_numel if self.targeted_numel else 0.0


@dataclass
class Model:
    """The torch module behind a checkpoint: ``names`` maps each parameter or buffer name of
    ``module`` to the checkpoint tensor it was loaded from."""

    kind: str
    module: torch.nn.Module
    context: int
    encode: Callable[[str], Encoded]
    logits: Callable[[torch.Tensor], torch.Tensor]
    names: dict[str, str]


def load_model(path: str | Path, needs: str) -> Model:
    """The float32 model of checkpoint ``path`` (sparsetool's GPT or a Hugging Face causal LM);
    ``needs`` ends the error for a model that is not a causal LM (what the caller does with it)."""
    path = Path(path)
    with open_checkpoint(path) as ckpt:
        names = {lt.name for lt in ckpt.logical}
        config = ckpt.config
    if (config or {}).get("model_type") == "sparsetool-gpt" or {"tok_emb.weight", "pos_emb.weight"} <= names:
        return _gpt_model(path, torch.float32)[0]
    if config is None:
        raise SparsetoolError(f"{path}: no config.json, so no model to run; {needs}: give a Hugging "
                              "Face model directory (config.json, weights, tokenizer files) or a "
                              "checkpoint of sparsetool train")
    return _hf_model(path, config, torch.float32, needs)[0]


def _counts(weights: dict[str, torch.Tensor]) -> dict[str, int]:
    out = dict(numel=0, nonzero=0, targeted_numel=0, targeted_nonzero=0)
    plan = plan_targets([(name, tuple(t.shape), t.dtype) for name, t in weights.items()])
    for name, t in weights.items():
        if not is_floating(t.dtype):
            continue
        nz = count_nonzero(t)
        out["numel"] += t.numel()
        out["nonzero"] += nz
        if plan[name].targeted:
            out["targeted_numel"] += t.numel()
            out["targeted_nonzero"] += nz
    return out


def open_lm(path: str | Path, dtype: str = "float32") -> LM:
    """The checkpoint at ``path`` as an :class:`LM`: sparsetool's GPT (a file or directory written
    by ``sparsetool train``, or anything pruned from one) or a Hugging Face causal-LM directory."""
    if dtype not in DTYPES:
        raise SparsetoolError(f"--dtype {dtype!r} is not one of: {', '.join(DTYPES)}")
    path = Path(path)
    with open_checkpoint(path) as ckpt:
        names = {lt.name for lt in ckpt.logical}
        config = ckpt.config
    if (config or {}).get("model_type") == "sparsetool-gpt" or {"tok_emb.weight", "pos_emb.weight"} <= names:
        return _gpt_lm(path, DTYPES[dtype])
    return _hf_lm(path, config, DTYPES[dtype])


# ---------------------------------------------------------------------------- sparsetool's GPT
def _gpt_model(path: Path, dtype: torch.dtype) -> tuple[Model, dict[str, torch.Tensor]]:
    from sparsetool.train.io import read_init_checkpoint
    from sparsetool.train.model import GPT, infer_config

    weights, _masks, meta = read_init_checkpoint(path)
    shapes = {k: tuple(v.shape) for k, v in weights.items()}
    cfg = infer_config(shapes, (meta.get("model") or {}).get("n_head"))
    model = GPT(cfg)
    own = model.state_dict()
    for name, t in own.items():
        if name not in weights:
            raise SparsetoolError(f"{path}: tensor {name!r} of sparsetool's GPT is missing; "
                                  "it is not a complete checkpoint written by sparsetool train")
        if tuple(weights[name].shape) != tuple(t.shape):
            raise SparsetoolError(f"{path}: tensor {name!r} has shape {list(weights[name].shape)}, "
                                  f"the model needs {list(t.shape)}")
    model.load_state_dict({k: weights[k] for k in own})
    model.to(dtype).eval()

    def encode(text: str) -> Encoded:
        data = text.encode("utf-8")
        return Encoded(list(data), lambda k: k)  # bytes are tokens

    def logits(ids: torch.Tensor) -> torch.Tensor:
        return model(ids)[0]

    return Model("sparsetool-gpt", model, cfg.context, encode, logits, {n: n for n in own}), weights


def _gpt_lm(path: Path, dtype: torch.dtype) -> LM:
    m, weights = _gpt_model(path, dtype)
    return LM(m.kind, m.context, m.encode, m.logits, **_counts(weights))


# ---------------------------------------------------------------------------- Hugging Face
def _hf_weights(path: Path, model: torch.nn.Module,
                origin: dict[str, str] | None = None) -> dict[str, torch.Tensor]:
    """The checkpoint's dense tensors under the model's own names, shapes checked against
    config.json; ``origin`` (if given) gets each model name's checkpoint name."""
    from sparsetool.ops.load import load

    return match_weights(path, model, load(path), origin=origin)


def _hf_model(path: Path, config: dict | None, dtype: torch.dtype,
              needs: str | None = None) -> tuple[Model, dict[str, torch.Tensor]]:
    transformers = _import_transformers()
    cfg = _hf_config(path, config, transformers, needs=needs)
    tok = _tokenizer(path, transformers)
    torch_state = torch.random.get_rng_state()
    try:
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager",
                                                              trust_remote_code=False)
    finally:  # the random initialisation is overwritten; do not disturb the caller's seed
        torch.random.set_rng_state(torch_state)
    origin: dict[str, str] = {}
    weights = _hf_weights(path, model, origin)
    model.load_state_dict(weights, strict=False)
    model.to(dtype).eval()

    def encode(text: str) -> Encoded:
        prev = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()  # "longer than the model's maximum" is expected
        try:
            enc = tok(text, return_offsets_mapping=bool(getattr(tok, "is_fast", False)))
        finally:
            transformers.logging.set_verbosity(prev)
        ids = list(enc["input_ids"])
        offsets = enc.get("offset_mapping")

        def byte_ends(k: int) -> int:
            if k >= len(ids):
                return len(text.encode("utf-8"))
            if offsets is not None:
                return len(text[: max(end for _, end in offsets[:k])].encode("utf-8")) if k else 0
            return len(tok.decode(ids[:k], skip_special_tokens=True).encode("utf-8"))

        return Encoded(ids, byte_ends)

    def logits(ids: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids, use_cache=False).logits

    return Model("huggingface", model, _context(cfg), encode, logits, origin), weights


def _hf_lm(path: Path, config: dict | None, dtype: torch.dtype) -> LM:
    m, weights = _hf_model(path, config, dtype)
    return LM(m.kind, m.context, m.encode, m.logits, **_counts(weights))


def read_text(path: str | Path, option: str = "--text") -> str:
    """A UTF-8 file, or every non-hidden file under a directory (sorted, joined by a newline)."""
    p = Path(path)
    if p.is_file():
        files = [p]
    elif p.is_dir():
        files = sorted(q for q in p.rglob("*") if q.is_file()
                       and not any(s.startswith(".") for s in q.relative_to(p).parts))
        if not files:
            raise SparsetoolError(f"{option} {p}: directory holds no files; point it at text files")
    else:
        raise SparsetoolError(f"{option} {p}: no such file or directory")
    parts = []
    for f in files:
        try:
            parts.append(f.read_bytes().decode("utf-8"))
        except UnicodeDecodeError as e:
            raise SparsetoolError(f"{option} {f}: not UTF-8 text (byte {e.start}); convert it or leave it out") from None
        except OSError as e:
            raise SparsetoolError(f"{option} {f}: cannot read ({e.strerror})") from None
    return "\n".join(parts)


