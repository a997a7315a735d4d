"""Opening a checkpoint as a :class:`~sparsetool.models.blocks.BlockModel`: which model it is
(sparsetool's GPT or a Hugging Face causal LM), its skeleton with every parameter on torch's meta
device, and the device and precision it runs in.

No code from the checkpoint directory ever runs: the config's ``auto_map`` is dropped,
transformers is told ``trust_remote_code=False``, and no module named in a config is imported.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch

from sparsetool.checkpoint import Checkpoint, open_checkpoint
from sparsetool.errors import ConfigError, SparsetoolError
from sparsetool.models.blocks import BlockModel, Encoded
from sparsetool.models.gpt import GPT, infer_config, model_record
from sparsetool.models.hf import (
    Piece,
    context_of,
    hf_config,
    import_transformers,
    load_tokenizer,
    match_names,
)

__all__ = ["DTYPES", "open_model", "resolve_device"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_device(device: str) -> torch.device:
    """``auto`` (CUDA if there is one, else the CPU), ``cpu``, ``cuda`` or ``cuda:N``; asking for
    CUDA where there is none is a :class:`ConfigError` (a usage error), raised before anything is
    read."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(
                f"--device {device}: no CUDA device is visible (this torch "
                f"{'has no CUDA support' if torch.version.cuda is None else 'sees no GPU'}); "
                "use --device cpu"
            )
        index = int(device[5:]) if device[5:] else 0
        if index >= torch.cuda.device_count():
            raise ConfigError(
                f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) "
                "are visible; use cuda:0 or another index"
            )
    return torch.device(device)


@contextlib.contextmanager
def _params_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device (no memory, no
    initialisation cost); buffers stay real, so what a model computes at construction survives."""
    register = torch.nn.Module.register_parameter

    def on_meta(self, name, param):
        if param is not None and param.device.type != "meta":
            param = torch.nn.Parameter(param.to("meta"), requires_grad=False)
        register(self, name, param)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


ATTENTION = ("sdpa", "eager")


def open_model(
    path: str | Path,
    dtype: str = "float32",
    device: str = "cpu",
    needs: str | None = None,
    attention: str = "sdpa",
) -> BlockModel:
    """The checkpoint at ``path`` as a :class:`BlockModel`: sparsetool's GPT (a file or directory
    written by ``sparsetool train``, or anything pruned from one) or a Hugging Face causal-LM
    directory. ``needs`` ends the error for a checkpoint that is not such a model.

    ``attention``: how a Hugging Face model computes attention (:data:`ATTENTION`). ``"sdpa"``,
    torch's fused kernel (where the model class has it, else eager), is what evaluation runs:
    2.7x the tokens per second of ``"eager"`` on SmolLM2 at windows of 2048, the same perplexity
    to 4 decimals. Calibration (prune, shrink) runs ``"eager"``, which materialises the scores:
    its statistics, and with them the masks it chooses, stay the bytes recorded for it, and its
    memory plan counts those scores."""
    if attention not in ATTENTION:
        raise ValueError(f"attention={attention!r} is not one of: {', '.join(ATTENTION)}")
    if dtype not in DTYPES:
        raise SparsetoolError(f"--dtype {dtype!r} is not one of: {', '.join(DTYPES)}")
    path = Path(path)
    dev = resolve_device(device)
    ckpt = open_checkpoint(path)
    try:
        names = {lt.name for lt in ckpt.logical}
        if (ckpt.config or {}).get("model_type") == "sparsetool-gpt" or {
            "tok_emb.weight",
            "pos_emb.weight",
        } <= names:
            return _gpt_model(path, ckpt, DTYPES[dtype], dev)
        if ckpt.config is None and needs is not None:
            raise SparsetoolError(
                f"{path}: no config.json, so no model to run; {needs}: give a Hugging "
                "Face model directory (config.json, weights, tokenizer files) or a "
                "checkpoint of sparsetool train"
            )
        return _hf_model(path, ckpt, DTYPES[dtype], dev, needs, attention)
    except BaseException:
        ckpt.close()
        raise


def _settle(module: torch.nn.Module, dtype: torch.dtype, device: torch.device) -> None:
    """Parameters (on meta) take the compute dtype; real buffers move to the device in it."""
    module.to(dtype)
    for name, buf in list(module.named_buffers()):
        owner, _, attr = name.rpartition(".")
        module.get_submodule(owner)._buffers[attr] = buf.to(device)
    module.eval()


# ---------------------------------------------------------------------------- sparsetool's GPT
def _gpt_model(
    path: Path, ckpt: Checkpoint, dtype: torch.dtype, device: torch.device
) -> BlockModel:
    shapes = {lt.name: tuple(lt.shape) for lt in ckpt.logical}
    cfg = infer_config(shapes, (model_record(ckpt).get("model") or {}).get("n_head"))
    with _params_on_meta():
        model = GPT(cfg)
    for name, p in model.named_parameters():
        if name not in shapes:
            raise SparsetoolError(
                f"{path}: tensor {name!r} of sparsetool's GPT is missing; "
                "it is not a complete checkpoint written by sparsetool train"
            )
        if shapes[name] != tuple(p.shape):
            raise SparsetoolError(
                f"{path}: tensor {name!r} has shape {list(shapes[name])}, "
                f"the model needs {list(p.shape)}"
            )
    _settle(model, dtype, device)

    def encode(text: str) -> Encoded:
        return Encoded(list(text.encode("utf-8")), lambda k: k)  # bytes are tokens

    sources = {n: [Piece(n)] for n, _ in model.named_parameters()}
    return BlockModel(
        path=path,
        ckpt=ckpt,
        kind="sparsetool-gpt",
        module=model,
        context=cfg.context,
        encode=encode,
        sources=sources,
        dtype=dtype,
        device=device,
        head_module=model.head,
        forward=lambda ids: model(ids),
    )


# ---------------------------------------------------------------------------- Hugging Face
def _hf_model(
    path: Path,
    ckpt: Checkpoint,
    dtype: torch.dtype,
    device: torch.device,
    needs: str | None,
    attention: str,
) -> BlockModel:
    transformers = import_transformers()
    cfg = hf_config(path, ckpt.config, transformers, needs=needs)
    tok = load_tokenizer(path, transformers)
    torch_state = torch.random.get_rng_state()
    try:
        with _params_on_meta():
            model = transformers.AutoModelForCausalLM.from_config(
                cfg,
                # transformers' default: sdpa where the model class has it, else eager
                attn_implementation=None if attention == "sdpa" else attention,
                trust_remote_code=False,
            )
    finally:  # nothing is initialised on meta, but do not disturb the caller's seed either way
        torch.random.set_rng_state(torch_state)
    shapes = {lt.name: tuple(lt.shape) for lt in ckpt.logical}
    origin = match_names(path, model, shapes)
    _settle(model, dtype, device)
    head = model.get_output_embeddings()
    if head is None:
        raise SparsetoolError(
            f"{path}: the model has no LM head; {needs or 'eval scores next-token prediction only'}"
        )

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

    return BlockModel(
        path=path,
        ckpt=ckpt,
        kind="huggingface",
        module=model,
        context=context_of(cfg),
        encode=encode,
        sources=origin,
        dtype=dtype,
        device=device,
        head_module=head,
        forward=lambda ids: model(input_ids=ids, use_cache=False),
    )
