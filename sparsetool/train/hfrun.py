"""Fine-tuning a Hugging Face causal LM (``sparsetool train --init HF_DIR``): what the training
loop needs from such a model and what the run writes.

The loop sees three things: the ``torch.nn.Module`` (its named parameters are the Hugging Face
names, so :func:`sparsetool.targets.plan_targets` targets exactly what ``prune`` targets),
:func:`forward` (token ids -> logits and the mean next-token cross-entropy) and the training text
as token ids of the directory's own tokenizer. Every checkpoint directory of the run is itself a
Hugging Face directory (config.json, tokenizer files, weights in the ``mask`` encoding for an exact
resume), and ``RUN/model/`` holds the latest model in the requested encoding.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from sparsetool.checkpoint import open_checkpoint
from sparsetool.checkpoint.codecs import DEFAULT_ENCODING, codec
from sparsetool.checkpoint.config import (
    bitmask_sparsity_config,
    drop_sparsity_config,
    read_model_config,
)
from sparsetool.checkpoint.provenance import provenance_metadata
from sparsetool.errors import ConfigError, UsageError
from sparsetool.models.hf import (
    TOKENIZER_FILES,
    context_of,
    hf_config,
    import_transformers,
    load_tokenizer,
    match_weights,
)
from sparsetool.train.consolidate import write_model
from sparsetool.train.distill import check_teacher
from sparsetool.train.memplan import TrainingPlan, check_plan, run_plan
from sparsetool.train.sharding import count_kept
from sparsetool.util.corpus import Corpus
from sparsetool.util.workers import signals_deferred

__all__ = [
    "HFModel",
    "HFModelInfo",
    "MODEL_DIR",
    "check_shape_flags",
    "forward",
    "is_hf_dir",
    "logits_only",
    "open_run_model",
    "tied_duplicates",
]

DEFAULT_CONTEXT = 256  # tokens per training sequence unless --context (or the model) says less
MODEL_DIR = "model"  # RUN/model/: the latest model as a Hugging Face directory
_COMPANIONS = set(TOKENIZER_FILES) | {
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
}
_TOKENIZE_CHUNK = 1 << 20  # characters per tokenizer call (cut at a newline)


def is_hf_dir(path: str | Path | None) -> bool:
    """Whether ``--init path`` is a Hugging Face directory (config.json of another model than
    ours)."""
    if path is None or not Path(path).is_dir():
        return False
    config = read_model_config(path)
    return config is not None and config.get("model_type") != "sparsetool-gpt"


def check_shape_flags(cfg, path: Path) -> None:
    """Refuse a shape flag with ``--init HF_DIR``: the shape is the model's (a usage error)."""
    for k in ("preset", "n_layer", "n_head", "d_model"):
        if getattr(cfg, k) is not None:
            raise UsageError(
                f"--{k.replace('_', '-')} cannot change a Hugging Face model; "
                f"its shape comes from {Path(path) / 'config.json'}"
            )


@dataclass(frozen=True)
class HFModelInfo:
    """The shape a run reports and stores in run.json (``model``)."""

    model_type: str
    n_layer: int
    n_head: int
    d_model: int
    context: int  # tokens per training sequence
    vocab_size: int
    dtype: str  # what RUN/model/ is written in: the --init weights' floating-point dtype
    source: str  # the --init directory

    def to_dict(self) -> dict:
        return asdict(self)


def tied_duplicates(model: torch.nn.Module) -> set[str]:
    """Names of parameters that are another parameter (a head tied to the embeddings): every
    name of a shared parameter but its first."""
    seen: set[int] = set()
    out = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            out.add(name)
        seen.add(id(p))
    return out


def forward(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, balance: bool = True):
    """Logits (B, T, V) and the mean cross-entropy of ``y`` (nats per token), as the built-in
    GPT. A mixture of experts whose config asks for its routers' load-balancing loss
    (``output_router_logits``) gets it added with its ``router_aux_loss_coef``, as transformers
    adds it to the loss it trains on; ``balance=False`` leaves it out (the validation loss)."""
    out = model(input_ids=x, use_cache=False)
    logits = out.logits
    loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))
    aux = getattr(out, "aux_loss", None)
    if balance and aux is not None:
        config = getattr(getattr(model, "module", model), "config", None)  # DDP holds .module
        loss = loss + float(getattr(config, "router_aux_loss_coef", 0.0) or 0.0) * aux.float()
    return logits, loss


def next_token_forward(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor):
    """:func:`forward` without the routers' load-balancing loss: the next-token loss only."""
    return forward(model, x, y, balance=False)


def logits_only(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The logits (B, T, V) of token ids ``x``, no loss: what distillation alone needs."""
    return model(input_ids=x, use_cache=False).logits


def open_run_model(
    cfg, resume_from: Path | None, resumed_model: dict | None, device: torch.device | None = None
):
    """``(HFModel, HFModelInfo, weights, masks)`` of a run on a Hugging Face model, or Nones.

    A resume rebuilds the model from its own latest checkpoint (config and tokenizer are there;
    ``--init`` is not read again) and takes its weights later; a new run reads ``--init``."""
    from sparsetool.train.runfiles import read_init_checkpoint

    resumed = resume_from is not None and "model_type" in (resumed_model or {})
    if (
        resume_from is None
        and cfg.init
        and Path(cfg.init).is_file()
        and is_hf_dir(Path(cfg.init).parent)
    ):
        raise ConfigError(
            f"--init {cfg.init} is a file of the Hugging Face directory "
            f"{Path(cfg.init).parent}; give the directory (its config and tokenizer are needed)"
        )
    if not resumed and not (resume_from is None and is_hf_dir(cfg.init)):
        if cfg.encoding != DEFAULT_ENCODING:
            raise UsageError(
                f"--encoding {cfg.encoding} applies to the Hugging Face directory a "
                "--init HF_DIR run writes; the built-in GPT's checkpoints use the mask encoding"
            )
        return None, None, {}, {}
    if not resumed:
        check_shape_flags(cfg, Path(cfg.init))  # before the model is read
    source = resume_from if resumed else cfg.init
    if source is None:  # a resumed run has its checkpoint, a new one here its --init HF_DIR
        raise AssertionError("no Hugging Face directory to train from")
    hf = HFModel(source)
    info = hf.info(cfg, resumed_model if resumed else None)
    if cfg.distill_from:  # the teacher's refusals come before any weight is read
        hf.teacher_config = check_teacher(cfg.distill_from, hf.tokenizer, info.vocab_size)
    # The model, its gradients and Adam's moments live in memory (whole on every process, or
    # divided among them with --distributed fsdp): refuse at once what cannot fit.
    hf.plan = check_plan(
        run_plan(
            cfg,
            device or torch.device("cpu"),
            params=hf.numel,
            n_layer=info.n_layer,
            d_model=info.d_model,
            n_head=info.n_head,
            context=info.context,
            vocab=info.vocab_size,
            teacher_params=_float_params(cfg.distill_from) if cfg.distill_from else 0,
            attention_scores=not hf.fused_attention,
        ),
        f"train --init {hf.path}",
    )
    weights, masks = ({}, {}) if resumed else read_init_checkpoint(cfg.init)[:2]
    return hf, info, weights, masks


def _float_params(path: str | Path) -> int:
    """The floating-point parameters a checkpoint stores (its headers alone)."""
    with open_checkpoint(Path(path)) as ckpt:
        return sum(lt.numel for lt in ckpt.logical if lt.floating)


class HFModel:
    """A Hugging Face directory (``--init``, or a resumed run's checkpoint) to train from."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        # the run's memory plan, made before the weights are read
        self.plan: TrainingPlan | None = None
        self.teacher_config = None  # a --distill-from teacher's, checked before them too
        self.transformers = import_transformers("fine-tuning")
        with open_checkpoint(self.path) as ckpt:
            config = ckpt.config
            dtypes = collections.Counter(
                lt.dtype for lt in ckpt.logical if lt.dtype.is_floating_point
            )
            self.numel = sum(lt.numel for lt in ckpt.logical if lt.dtype.is_floating_point)
        # the tokenizer first: transformers' remarks on a config never precede its refusal
        self.tokenizer = load_tokenizer(self.path, self.transformers)
        self.hf_cfg = hf_config(self.path, config, self.transformers, "train --init")
        if config is None:  # hf_config refused a directory without config.json
            raise AssertionError(f"{self.path}: no config.json")
        self.config = drop_sparsity_config(config)  # weights are re-encoded on every write
        self.dtype = dtypes.most_common(1)[0][0] if dtypes else torch.float32
        # read now: a resumed run's source checkpoint is deleted once newer ones are kept
        self.files = {
            f.name: f.read_bytes()
            for f in sorted(self.path.iterdir())
            if f.is_file() and (f.name in _COMPANIONS or f.name.startswith("tokenizer"))
        }

    @property
    def fused_attention(self) -> bool:
        """Whether the model computes attention in a fused kernel (sdpa, transformers' default for
        a model class that has it; flash attention), which keeps no attention scores for the
        backward pass; eager attention keeps them (the memory plan counts them then)."""
        asked = getattr(self.hf_cfg, "_attn_implementation", None)
        if asked is not None:
            return asked != "eager"
        names = self.transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        name = names.get(self.hf_cfg.model_type)
        return bool(getattr(getattr(self.transformers, name or "", None), "_supports_sdpa", False))

    def info(self, cfg, saved: dict | None = None) -> HFModelInfo:
        """The run's model shape; a shape flag is an error, ``--context`` at most the model's."""
        if saved:
            return HFModelInfo(**saved)
        check_shape_flags(cfg, self.path)
        longest = context_of(self.hf_cfg)
        if cfg.context is not None and cfg.context > longest:
            raise UsageError(
                f"--context {cfg.context} is longer than the {longest} positions of "
                f"{self.path / 'config.json'}; give at most {longest}"
            )
        c = self.hf_cfg
        return HFModelInfo(
            model_type=c.model_type,
            n_layer=int(c.num_hidden_layers),
            n_head=int(c.num_attention_heads),
            d_model=int(c.hidden_size),
            context=int(cfg.context or min(longest, DEFAULT_CONTEXT)),
            vocab_size=int(c.vocab_size),
            dtype=str(self.dtype).removeprefix("torch."),
            source=str(self.path),
        )

    def build(self) -> torch.nn.Module:
        """The model of config.json in float32, randomly initialised (the caller loads weights)."""
        model = self.transformers.AutoModelForCausalLM.from_config(
            self.hf_cfg, trust_remote_code=False
        )
        return model.float()

    def matched(
        self, model: torch.nn.Module, weights: dict[str, torch.Tensor], source
    ) -> dict[str, torch.Tensor]:
        """A checkpoint's dense tensors under ``model``'s own names (a tied head once), checked."""
        return match_weights(Path(source), model, weights, "train --init")

    # ------------------------------------------------------------------ data
    def tokenize(self, corpus: Corpus, context: int) -> tuple[Corpus, dict]:
        """The byte corpus as token ids of the directory's tokenizer (no special tokens added),
        and its description for the log; each side must fill one sequence."""
        sides = {}
        for side in ("train", "val"):
            text = getattr(corpus, side).tobytes().decode("utf-8", errors="replace")
            sides[side] = self._ids(text)
            if sides[side].size < context + 1:
                raise ConfigError(
                    f"the {side} split of {corpus.source} is {sides[side].size} tokens long, fewer "
                    f"than the {context + 1} one sequence needs; use more text or a smaller "
                    "--context"
                )
        info = {
            **corpus.describe(),
            "train_tokens": int(sides["train"].size),
            "val_tokens": int(sides["val"].size),
            "tokenizer": str(self.path),
        }
        return Corpus(
            sides["train"], sides["val"], corpus.source, corpus.train_files, corpus.val_files
        ), info

    def _ids(self, text: str) -> np.ndarray:
        pieces, start = [], 0
        while start < len(text):
            end = text.find("\n", start + _TOKENIZE_CHUNK)
            end = len(text) if end < 0 else end + 1
            pieces.append(text[start:end])
            start = end
        if not pieces:
            return np.zeros(0, dtype=np.int64)
        logging = self.transformers.logging
        prev = logging.get_verbosity()
        logging.set_verbosity_error()  # "longer than the model's maximum" is expected here
        try:
            ids = self.tokenizer(pieces, add_special_tokens=False)["input_ids"]
        finally:
            logging.set_verbosity(prev)
        return np.concatenate([np.asarray(i, dtype=np.int64) for i in ids])

    # ------------------------------------------------------------------ files
    def write_files(self, directory: Path, config: dict | None = None) -> None:
        """config.json, the tokenizer files and generation_config.json of the source, into
        ``directory``."""
        (directory / "config.json").write_text(
            json.dumps(config or self.config, indent=2, sort_keys=True) + "\n"
        )
        for name, data in self.files.items():
            (directory / name).write_bytes(data)

    def export_bytes(
        self, model: torch.nn.Module, targeted: list[tuple[str, int]], encoding: str
    ) -> int:
        """About the bytes of ``RUN/model/model.safetensors`` (:meth:`export`): the weights in
        the source's dtype (a tied head once), in ``encoding`` for the ``targeted`` (name, numel)
        of a sparse run (bitmask: counted as if nothing were pruned, an upper bound)."""
        tied = tied_duplicates(model)
        masked = {name for name, _ in targeted}
        size = torch.empty((), dtype=self.dtype).element_size()
        total = sum(
            t.numel() * size + len(n) + 96
            for n, t in model.state_dict().items()
            if n not in tied or n in masked
        )
        kept = sum(numel for _, numel in targeted)
        if codec(encoding).side_mask:
            total += kept
        elif codec(encoding).compressed:
            total += kept // 8 + 1
        return total + 4096

    def export(
        self,
        run_dir: Path,
        model: torch.nn.Module,
        masks: dict[str, torch.Tensor],
        encoding: str,
        meta: dict,
        dtype: str,
        write: bool = True,
    ) -> Path:
        """Write ``RUN/model/`` (weights in ``encoding`` and ``dtype``, config, tokenizer)
        atomically: a temporary directory renamed over the previous one. The weights are
        streamed one tensor at a time (:func:`~sparsetool.train.consolidate.write_model`), so
        for a model sharded over ranks every rank calls this alike and only ``write`` writes."""
        out = run_dir / MODEL_DIR
        tmp, old = run_dir / f".{MODEL_DIR}.tmp", run_dir / f".{MODEL_DIR}.old"
        if write:
            for p in (tmp, old):
                if p.exists():
                    shutil.rmtree(p)
            tmp.mkdir()
        tied = tied_duplicates(model)  # a tied head: transformers ties it again on loading
        tensors = [(n, t) for n, t in model.state_dict().items() if n not in tied or n in masks]
        kept = sum(
            count_kept(m) for m in masks.values()
        )  # a collective for sharded masks: all ranks
        meta = {**meta, "encoding": encoding if masks else "plain"}
        write_model(
            tmp / "model.safetensors",
            tensors,
            masks,
            encoding=encoding,
            metadata={"format": "pt", **provenance_metadata(None, meta)},
            dtype=getattr(torch, dtype),
            write=write,
        )
        if not write:
            return out
        config = dict(self.config)
        if codec(encoding).compressed and masks:
            total = sum(m.numel() for m in masks.values())
            config = bitmask_sparsity_config(
                config, [n.removesuffix(".weight") for n in masks], 1.0 - kept / total
            )
        self.write_files(tmp, config)
        with signals_deferred():  # a signal between the two renames would leave no RUN/model/
            if out.exists():
                os.replace(out, old)
            os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
        return out
