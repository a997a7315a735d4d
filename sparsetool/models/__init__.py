"""A checkpoint as a runnable model: sparsetool's GPT or a Hugging Face causal LM.

Modules::

    gpt.py      sparsetool's GPT (GPT, GPTConfig, PRESETS), infer_config from a checkpoint's
                shapes, model_record (the run's sparsetool metadata with the model's shape)
    hf.py       a Hugging Face directory as a model: config, tokenizer, weight names
    blocks.py   BlockModel: a model whose blocks are read from the checkpoint one at a time
    open.py     open_model: which model a checkpoint is, its meta-device skeleton, device, dtype

Used by ``ops`` (eval, calibration pruning, ``eval --tasks``) and ``train`` (the trainer,
``--init``); imports neither. Each name is imported from its module on first use (``_WHERE``),
so ``import sparsetool.models`` imports neither torch nor transformers.
"""

from __future__ import annotations

from sparsetool.util.lazy import lazy_names

_WHERE = {
    "BlockModel": ".blocks",
    "Call": ".blocks",
    "Encoded": ".blocks",
    "block_index": ".blocks",
    "find_blocks": ".blocks",
    "GPT": ".gpt",
    "GPTConfig": ".gpt",
    "PRESETS": ".gpt",
    "VOCAB_SIZE": ".gpt",
    "infer_config": ".gpt",
    "model_record": ".gpt",
    "HF_EXTRA": ".hf",
    "MAX_DEFAULT_SEQ": ".hf",
    "TOKENIZER_FILES": ".hf",
    "context_of": ".hf",
    "hf_config": ".hf",
    "import_transformers": ".hf",
    "load_tokenizer": ".hf",
    "match_names": ".hf",
    "match_weights": ".hf",
    "DTYPES": ".open",
    "open_model": ".open",
    "resolve_device": ".open",
}

__all__ = sorted(_WHERE)

__getattr__, __dir__ = lazy_names(__name__, _WHERE)
