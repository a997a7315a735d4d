"""Random small models of the families ``convert DIR -o FILE.gguf`` writes beyond Llama and Qwen
(Gemma-3, Qwen3-MoE, Mixtral) and their shrunk outputs, for ``bench_llamacpp.py`` to check in
llama.cpp itself:

  python benchmarks/make_gguf_families.py TEXT --out DIR
  python benchmarks/bench_llamacpp.py --heldout DIR/heldout.txt --types f16,q8_0 \\
      --model gemma3=DIR/gemma3 ... (the names this script prints)

TEXT: any English text (HELDOUT, say); its first 80% trains a byte-level BPE of 512 tokens and is
the calibration text, the rest is the held-out text. Models (seeded, width 256, 512 positions,
weights drawn at 0.08 so the next token is not a coin toss, norms away from their identity):

- ``gemma3``: 6 blocks, the sixth full and the rest sliding (a window of 32), Gemma's defaults;
- ``gemma3mix``: the full blocks second and fifth (off llama.cpp's every-sixth default);
- ``gemma3lin``: the full layers' RoPE scaled linearly (factor 8), as Gemma-3 4B and larger;
- ``qwen3moe``: 4 blocks of 8 experts of width 128, 2 routed, the top-k weights renormalised;
- ``mixtral``: 4 blocks of 8 experts of width 256, 2 routed;
- ``llama31``: Llama with Llama 3.1's RoPE scaling (``llama3``, factor 8, an original context
  of 64 positions, so the 256 scored reach past it);
- ``gemma3spm`` and ``llamaspm``: Gemma-3 and Llama with a SentencePiece-style BPE (spaces as
  ``▁``, byte fallback) as transformers' ``GemmaTokenizer`` and ``LlamaTokenizer`` build it;

and from them, by ``sparsetool shrink`` on the calibration text: ``gemma3-b1`` (a block
removed), ``gemma3-ffn`` (``--ffn 0.5``), ``qwen3moe-e4`` and ``mixtral-e4`` (``--experts
0.5``).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def _tokenizer(directory: Path, text: str) -> None:
    import transformers as t
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<unk>", "<s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([text], trainer)
    fast = t.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                     eos_token="<s>")  # fmt: skip
    fast.save_pretrained(directory)


def _pieces(directory: Path, text: str, kind: str) -> None:
    """A SentencePiece-style BPE of 1,024 tokens, as transformers' Gemma or Llama tokenizer."""
    import json

    import transformers as t
    from tokenizers import Tokenizer, models, normalizers, trainers

    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    names = ["<pad>", "<eos>", "<bos>", "<unk>"] if kind == "gemma" else ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=names + byte_tokens)
    tok.train_from_iterator([text], trainer)
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    cls = t.GemmaTokenizer if kind == "gemma" else t.LlamaTokenizer
    cls(vocab=model["vocab"], merges=merges).save_pretrained(directory)


def _configs() -> dict:
    import transformers as t

    small = dict(vocab_size=512, max_position_embeddings=512, bos_token_id=1, eos_token_id=1)
    heads = dict(num_attention_heads=4, num_key_value_heads=2)
    gemma = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=6, head_dim=64,
                 query_pre_attn_scalar=64, sliding_window=32, **heads, **small)  # fmt: skip
    full, sliding = "full_attention", "sliding_attention"
    linear = {full: {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
              sliding: {"rope_type": "default", "rope_theta": 1e4}}  # fmt: skip
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
              "rope_theta": 500000.0}  # fmt: skip
    return {
        "gemma3": t.Gemma3TextConfig(**gemma),
        "gemma3mix": t.Gemma3TextConfig(
            layer_types=[sliding, full, sliding, sliding, full, sliding], **gemma
        ),
        "gemma3lin": t.Gemma3TextConfig(rope_parameters=linear, **gemma),
        "qwen3moe": t.Qwen3MoeConfig(
            hidden_size=256,
            intermediate_size=512,
            moe_intermediate_size=128,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            num_hidden_layers=4,
            head_dim=64,
            **heads,
            **small,
        ),  # fmt: skip
        "gemma3spm": t.Gemma3TextConfig(**{**gemma, "vocab_size": 1032, "bos_token_id": 2}),
        "llamaspm": t.LlamaConfig(
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=4,
            **heads,
            **{**small, "vocab_size": 1032},
        ),  # fmt: skip
        "llama31": t.LlamaConfig(
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=4,
            rope_parameters=llama3,
            **heads,
            **small,
        ),  # fmt: skip
        "mixtral": t.MixtralConfig(
            hidden_size=256,
            intermediate_size=256,
            num_local_experts=8,
            num_experts_per_tok=2,
            num_hidden_layers=4,
            **heads,
            **small,
        ),  # fmt: skip
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("text", type=Path, help="English text (tokenizer, calibration, held-out)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    import torch
    import transformers as t

    from sparsetool.ops.shrink import ShrinkOptions, shrink_checkpoint

    text = args.text.read_text()
    cut = int(len(text) * 0.8)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "calib.txt").write_text(text[:cut])
    (args.out / "heldout.txt").write_text(text[cut:])
    for name, config in _configs().items():
        torch.manual_seed(0)
        model = t.AutoModelForCausalLM.from_config(config).eval()
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if "norm" in pname:  # Gemma's norms are 1 + w: around 1 either way
                    p.uniform_(-0.5, 0.5) if name.startswith("gemma") else p.uniform_(0.5, 1.5)
                elif p.dim() == 2:
                    p.normal_(0, 0.08)
        model.save_pretrained(args.out / name)
        if name.endswith("spm"):
            _pieces(args.out / name, text[:cut], "gemma" if name.startswith("gemma") else "llama")
        else:
            _tokenizer(args.out / name, text[:cut])
        print(f"{name}={args.out / name}")
    calib = dict(calibration=str(args.out / "calib.txt"), samples=8, seq=128)
    for name, source, asked in (
        ("gemma3-b1", "gemma3", dict(blocks=1)),
        ("gemma3-ffn", "gemma3", dict(ffn=0.5)),
        ("qwen3moe-e4", "qwen3moe", dict(experts=0.5)),
        ("mixtral-e4", "mixtral", dict(experts=0.5)),
    ):
        shrink_checkpoint(args.out / source, args.out / name, ShrinkOptions(**asked, **calib))
        print(f"{name}={args.out / name}")


if __name__ == "__main__":
    main()
