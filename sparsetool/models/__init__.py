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

from typing import TYPE_CHECKING

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

if TYPE_CHECKING:  # what a type checker sees; at run time each name loads on first use
    from .blocks import BlockModel as BlockModel
    from .blocks import Call as Call
    from .blocks import Encoded as Encoded
    from .blocks import block_index as block_index
    from .blocks import find_blocks as find_blocks
    from .gpt import GPT as GPT
    from .gpt import PRESETS as PRESETS
    from .gpt import VOCAB_SIZE as VOCAB_SIZE
    from .gpt import GPTConfig as GPTConfig
    from .gpt import infer_config as infer_config
    from .gpt import model_record as model_record
    from .hf import HF_EXTRA as HF_EXTRA
    from .hf import MAX_DEFAULT_SEQ as MAX_DEFAULT_SEQ
    from .hf import TOKENIZER_FILES as TOKENIZER_FILES
    from .hf import context_of as context_of
    from .hf import hf_config as hf_config
    from .hf import import_transformers as import_transformers
    from .hf import load_tokenizer as load_tokenizer
    from .hf import match_names as match_names
    from .hf import match_weights as match_weights
    from .open import DTYPES as DTYPES
    from .open import open_model as open_model
    from .open import resolve_device as resolve_device

__getattr__, __dir__ = lazy_names(__name__, _WHERE)
