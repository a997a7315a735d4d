"""GGUF files written here from small random transformers models, for the GGUF path of a second
architecture (GPT-2: Conv1D layout, fused q/k/v, biases, LayerNorm, learned positions, a head
tied to the embedding) beside the Llama one of ``real_model.py``: no such file is shipped by a
package small enough, so the ``gguf`` package's writer makes one, optionally quantized (Q8_0,
Q4_1: groups of 32 along each row, as llama.cpp stores them); transformers loads it back with
``gguf_file=`` as it loads a downloaded one, and ``sparsetool convert`` turns it into a directory.

The names and orientations are the ones transformers' GGUF loader reads (and llama.cpp writes):
``token_embd``, ``position_embd``, ``blk.N.attn_qkv`` ... with the Conv1D weights transposed to
(out, in), the vocabulary as ``tokenizer.ggml.tokens`` with its byte-level BPE ``merges``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

__all__ = [
    "convert_gguf",
    "load_gguf_model",
    "logits_of",
    "sample_ids",
    "tiny_gpt2_gguf",
    "write_gguf_of",
    "write_gpt2_gguf",
]

_CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
_NAMES = {
    "attn.c_attn": "attn_qkv",
    "attn.c_proj": "attn_output",
    "mlp.c_fc": "ffn_up",
    "mlp.c_proj": "ffn_down",
    "ln_1": "attn_norm",
    "ln_2": "ffn_norm",
}


def _gguf_name(name: str) -> str:
    fixed = {
        "transformer.wte.weight": "token_embd.weight",
        "transformer.wpe.weight": "position_embd.weight",
        "transformer.ln_f.weight": "output_norm.weight",
        "transformer.ln_f.bias": "output_norm.bias",
    }
    if name in fixed:
        return fixed[name]
    _, _, block, rest = name.split(".", 3)  # transformer.h.N.<module>.<param>
    module, param = rest.rsplit(".", 1)
    return f"blk.{block}.{_NAMES[module]}.{param}"


def write_gpt2_gguf(model, tokenizer_dir: Path, out: Path, qtype: str = "F32") -> Path:
    """``model`` (a transformers GPT2LMHeadModel, tied head) and the byte-level BPE tokenizer saved
    in ``tokenizer_dir`` as one GGUF file ``out``; the block matrices stored as ``qtype`` (F32,
    Q8_0 or Q4_1), everything else F32."""
    import gguf

    cfg = model.config
    tok = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tok["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    if len(tokens) != cfg.vocab_size:
        raise ValueError(f"the tokenizer has {len(tokens)} tokens, the model {cfg.vocab_size}")
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    specials = {a["content"] for a in tok.get("added_tokens", []) if a.get("special")}
    w = gguf.GGUFWriter(str(out), "gpt2")
    w.add_context_length(cfg.n_positions)
    w.add_embedding_length(cfg.n_embd)
    w.add_feed_forward_length(cfg.n_inner or 4 * cfg.n_embd)
    w.add_block_count(cfg.n_layer)
    w.add_head_count(cfg.n_head)
    w.add_layer_norm_eps(cfg.layer_norm_epsilon)
    w.add_file_type(
        gguf.LlamaFileType.ALL_F32
        if qtype == "F32"
        else getattr(gguf.LlamaFileType, f"MOSTLY_{qtype}")
    )
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types(
        [gguf.TokenType.CONTROL if t in specials else gguf.TokenType.NORMAL for t in tokens]
    )
    w.add_token_merges(merges)
    w.add_bos_token_id(cfg.bos_token_id)
    w.add_eos_token_id(cfg.eos_token_id)
    quant = getattr(gguf.GGMLQuantizationType, qtype)
    for name, p in model.state_dict().items():
        if (
            name == "lm_head.weight"
            or name.endswith(".attn.bias")
            or name.endswith(".attn.masked_bias")
        ):
            continue  # the tied head is the embedding; causal-mask buffers are not weights
        a = p.detach().float().numpy()
        if any(f".{c}.weight" in name for c in _CONV1D):
            a = np.ascontiguousarray(a.T)  # Conv1D (in, out) -> the file's (out, in)
            if qtype != "F32":
                w.add_tensor(_gguf_name(name), gguf.quants.quantize(a, quant), raw_dtype=quant)
                continue
        w.add_tensor(_gguf_name(name), np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def tiny_gpt2_gguf(directory: Path, qtype: str = "F32", seed: int = 0):
    """A random 2-block GPT-2 (width 64, a tokenizer trained here) and its GGUF file
    ``directory/tiny-<qtype>.gguf``: (the transformers model, the file)."""
    import torch
    import transformers

    from helpers import make_text, save_tokenizer

    directory.mkdir(parents=True, exist_ok=True)
    tok = directory / "tok"
    if not (tok / "tokenizer.json").is_file():
        save_tokenizer(tok, make_text(400))
    vocab = len(json.loads((tok / "tokenizer.json").read_text())["model"]["vocab"])
    torch.manual_seed(seed)
    # n_positions 1024: transformers reads GPT-2's context_length as n_ctx only, so a file of
    # another position count fails to load (its position embedding does not fit the default)
    model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            n_layer=2,
            n_embd=64,
            n_head=4,
            vocab_size=vocab,
            n_positions=1024,
            bos_token_id=1,
            eos_token_id=1,
        )
    ).eval()
    return model, write_gpt2_gguf(model, tok, directory / f"tiny-{qtype}.gguf", qtype)


def write_gguf_of(out: Path, architecture: str) -> Path:
    """A small well-formed GGUF file of ``architecture`` (a name transformers may not map): a few
    keys and one F32 tensor."""
    import gguf

    w = gguf.GGUFWriter(str(out), architecture)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_tensor("token_embd.weight", np.zeros((16, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def convert_gguf(source: Path, out: Path) -> Path:
    """A GGUF file as a Hugging Face directory of float32 safetensors (the weights dequantized),
    with its tokenizer: sparsetool's own conversion (``sparsetool convert``), as for SmolLM2."""
    from sparsetool.ops.convert import convert_gguf as convert

    return convert(source, out).output


def sample_ids(directory: Path):
    """Two rows of 64 token ids of a held-out sample, by the directory's tokenizer."""
    import torch
    import transformers

    from helpers import make_text

    tok = transformers.AutoTokenizer.from_pretrained(directory)
    return torch.tensor(tok(make_text(40, seed=3))["input_ids"][:128]).view(2, 64)


def logits_of(model, ids):
    """``model``'s logits of ``ids``, without the cache."""
    import torch

    with torch.no_grad():
        return model(ids, use_cache=False).logits


def load_gguf_model(path: Path):
    """The GGUF file ``path`` as transformers' own GGUF reader loads it, in float32."""
    import torch
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()
