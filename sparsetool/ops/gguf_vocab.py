"""A Hugging Face tokenizer as GGUF metadata, for ``convert DIR -o FILE.gguf``.

Two kinds, from ``tokenizer.json`` and ``tokenizer_config.json``:

- a byte-level BPE (GPT-2's kind: Llama 3, SmolLM2, Qwen), as llama.cpp's ``gpt2`` tokenizer:
  ``tokenizer.ggml.pre`` named from the pre-tokenizer when it is a split llama.cpp knows (else
  left out: llama.cpp splits its default way and warns);
- a SentencePiece-style BPE (spaces as ``▁``, unknown characters as ``<0xXX>`` byte tokens:
  Gemma, Llama 2), as llama.cpp's ``llama`` tokenizer. llama.cpp merges the adjacent pair whose
  token scores highest, so each token's score is minus the rank of the merge that makes it (the
  BPE's own order); byte tokens are typed ``byte``; ``add_space_prefix`` says whether a text
  starts with ``▁`` (a ``Prepend`` normalizer or a ``Metaspace`` that prepends).

Both carry the tokens in id order with their types (normal, control, user defined, unused), the
merges (transformers' GGUF reader builds its tokenizer from them), the special tokens' ids,
``add_bos_token`` (so llama.cpp adds BOS where transformers does) and the chat template. Any
other kind (WordPiece, Unigram) is refused in one error naming the file.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from sparsetool.errors import CheckpointError
from sparsetool.util.wording import plural

__all__ = ["read_tokenizer", "write_tokenizer"]

_BYTE_TOKEN = re.compile(r"<0x[0-9A-F]{2}>")

# pre-tokenizer regexes llama.cpp names (tokenizer.json's Split pattern -> tokenizer.ggml.pre)
_GPT2_SPLIT = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
_QWEN2_SPLIT = (
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
_LLAMA3_SPLIT = (
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)


def read_tokenizer(source: Path, rows: int, config: dict) -> dict:
    """The tokenizer's tokens (id order, padded with unused ones to the embedding's ``rows``),
    types, merges, special ids, flags and chat template, from ``tokenizer.json`` and
    ``tokenizer_config.json``; a tokenizer that is not a BPE, byte-level or with byte fallback,
    refused."""
    path = source / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(
            f"{source}: no tokenizer.json; a GGUF file carries the tokenizer, and convert reads "
            "it from tokenizer.json (save the model's tokenizer with transformers first)"
        )
    data = json.loads(path.read_text())
    model = data.get("model") or {}
    byte_level = model.get("type") == "BPE" and _byte_level(data)
    pieces = model.get("type") == "BPE" and bool(model.get("byte_fallback")) and not byte_level
    if not (byte_level or pieces):
        raise CheckpointError(
            f"{path}: a {model.get('type')} tokenizer"
            + (" neither byte-level nor with byte_fallback" if model.get("type") == "BPE" else "")
            + "; convert writes BPE tokenizers into GGUF, byte-level (GPT-2's kind: Llama 3, "
            "SmolLM2, Qwen) or with byte fallback (SentencePiece's kind: Gemma, Llama 2)"
        )
    vocab: dict[str, int] = dict(model["vocab"])
    added = {a["content"]: a for a in data.get("added_tokens", [])}
    for content, a in added.items():
        vocab[content] = a["id"]
    if max(vocab.values()) + 1 > rows:
        raise CheckpointError(
            f"{path}: {plural(max(vocab.values()) + 1, 'token')}, more than the "
            f"{rows:,} rows of the embeddings (config.json's vocab_size); llama.cpp would refuse "
            "the file"
        )
    size = rows
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [5] * size  # unused
    for token, i in vocab.items():
        tokens[i] = token
        a = added.get(token)
        types[i] = 1 if a is None else (3 if a.get("special") else 4)  # normal, control, user
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    scores: list[float] = []
    if pieces:
        for i, token in enumerate(tokens):
            if _BYTE_TOKEN.fullmatch(token):  # also when listed as added, as llama.cpp types them
                types[i] = 6  # a byte, for byte fallback
        scores = _merge_scores(tokens, merges)
    cfg_path = source / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    template = cfg.get("chat_template")
    jinja = source / "chat_template.jinja"
    if template is None and jinja.is_file():
        template = jinja.read_text()

    def token_id(key: str) -> int | None:
        value = cfg.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str) and value in vocab:
            return vocab[value]
        fallback = config.get(f"{key}_id")  # config.json's bos_token_id, eos_token_id, ...
        return fallback if isinstance(fallback, int) else None

    unk = token_id("unk_token")
    if pieces and unk is not None:
        types[unk] = 2  # unknown
    return {
        "model": "gpt2" if byte_level else "llama",
        "tokens": tokens,
        "types": types,
        "scores": scores,
        "space_prefix": _space_prefix(data),
        "merges": merges,
        "pre": _pre_name(data.get("pre_tokenizer")) if byte_level else None,
        "bos": token_id("bos_token"),
        "eos": token_id("eos_token"),
        "unk": unk,
        "pad": token_id("pad_token"),
        "add_bos": _adds_bos(cfg, data, token_id("bos_token"), vocab),
        "template": template if isinstance(template, str) else None,
    }


def _adds_bos(cfg: dict, data: dict, bos: int | None, vocab: dict[str, int]) -> bool:
    """Whether encoding puts the BOS token first: tokenizer_config.json's ``add_bos_token``, else
    whether tokenizer.json's post-processor template starts a text with it (so llama.cpp, which
    reads ``tokenizer.ggml.add_bos_token``, does as transformers does)."""
    if isinstance(cfg.get("add_bos_token"), bool):
        return bool(cfg["add_bos_token"])
    post = data.get("post_processor") or {}
    steps = post.get("processors", [post]) if post.get("type") == "Sequence" else [post]
    for step in steps:
        single = step.get("single") if step.get("type") == "TemplateProcessing" else None
        first = (single or [{}])[0].get("SpecialToken", {}).get("id")
        if first is not None and bos is not None and vocab.get(first) == bos:
            return True
    return False


def _merge_scores(tokens: list[str], merges: list[str]) -> list[float]:
    """Each token's score for llama.cpp's SentencePiece tokenizer, which merges the adjacent pair
    whose joined token scores highest: minus the rank of the merge that makes the token (0 for a
    token no merge makes: characters, bytes, special tokens)."""
    rank: dict[str, int] = {}
    for r, merge in enumerate(merges):
        left, _, right = merge.partition(" ")
        rank.setdefault(left + right, r + 1)
    return [-float(rank.get(token, 0)) for token in tokens]


def _space_prefix(data: dict) -> bool:
    """Whether the tokenizer puts a ``▁`` before a text: a ``Prepend`` normalizer, or a
    ``Metaspace`` pre-tokenizer that prepends (Llama 2's; Gemma's does not)."""

    def found(node: Any) -> bool:
        if isinstance(node, dict):
            if node.get("type") == "Prepend":
                return True
            if node.get("type") == "Metaspace":
                return node.get("prepend_scheme", "always") != "never" and bool(
                    node.get("add_prefix_space", True)
                )
            return any(found(v) for v in node.values())
        if isinstance(node, list):
            return any(found(v) for v in node)
        return False

    return found(data.get("normalizer")) or found(data.get("pre_tokenizer"))


def _byte_level(data: dict) -> bool:
    """Whether the tokenizer maps bytes to characters as GPT-2 does (its pre-tokenizer or decoder
    is ByteLevel)."""

    def has(node: Any) -> bool:
        if isinstance(node, dict):
            return node.get("type") == "ByteLevel" or any(has(v) for v in node.values())
        if isinstance(node, list):
            return any(has(v) for v in node)
        return False

    return has(data.get("pre_tokenizer")) or has(data.get("decoder"))


def _pre_name(pre: Any) -> str | None:
    """llama.cpp's name for the pre-tokenizer (how text is split before the merges), or None."""
    if not isinstance(pre, dict):
        return None
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return None if pre.get("add_prefix_space") else "gpt-2"
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not steps:
        return None
    kinds = [s.get("type") for s in steps]
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits"):
        return "smollm" if steps[1].get("use_regex", True) else None
    if kinds == ["Split", "ByteLevel"] and not steps[1].get("use_regex", True):
        pattern = (steps[0].get("pattern") or {}).get("Regex")
        return {_QWEN2_SPLIT: "qwen2", _LLAMA3_SPLIT: "llama-bpe", _GPT2_SPLIT: "gpt-2"}.get(
            pattern or ""
        )
    return None


def write_tokenizer(writer: Any, tok: dict) -> None:
    """``tok`` (:func:`read_tokenizer`'s) as ``tokenizer.ggml.*`` keys."""
    writer.add_tokenizer_model(tok["model"])
    if tok["pre"]:
        writer.add_tokenizer_pre(tok["pre"])
    writer.add_token_list(tok["tokens"])
    writer.add_token_types(tok["types"])
    if tok["model"] == "llama":
        writer.add_token_scores(tok["scores"])
        writer.add_add_space_prefix(bool(tok["space_prefix"]))
    writer.add_token_merges(tok["merges"])
    for key, add in (
        ("bos", writer.add_bos_token_id),
        ("eos", writer.add_eos_token_id),
        ("unk", writer.add_unk_token_id),
        ("pad", writer.add_pad_token_id),
    ):
        if tok[key] is not None:
            add(tok[key])
    writer.add_add_bos_token(bool(tok["add_bos"]))
    if tok["template"]:
        writer.add_chat_template(tok["template"])
