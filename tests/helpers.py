"""What the tests share: real checkpoints, models, texts and corpora made on the fly (nothing is
downloaded), and one way to run the CLI. Fixtures live in conftest.py; test modules import these
with ``from helpers import ...`` (tests/ is on sys.path: pytest puts it there for conftest.py)."""

from __future__ import annotations

import contextlib
import functools
import json
import random
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from sparsetool.hardware.devices import CPU

ROOT = (
    Path(__file__).resolve().parents[1]
)  # the repository: README.md, docs/, fixtures/, sparsetool/


# ----------------------------------------------------------------------------- the CLI
def run(*args: object, columns: int | None = None, **kw):
    """``sparsetool ARGS`` in-process through typer's CliRunner, each argument str()-ed;
    ``columns`` fixes the terminal width (COLUMNS), other keywords go to ``invoke``."""
    from typer.testing import CliRunner

    from sparsetool.cli.main import app

    if columns is None:
        return CliRunner().invoke(app, [str(a) for a in args], **kw)
    kw["env"] = {**(kw.get("env") or {}), "COLUMNS": str(columns)}
    # The consoles read COLUMNS once, when the first command of the process made them.
    from sparsetool.cli._output import console, err_console

    widths = console.width, err_console.width
    console.width = err_console.width = columns
    try:
        return CliRunner().invoke(app, [str(a) for a in args], **kw)
    finally:
        console.width, err_console.width = widths


def runner_for(*prefix: str, columns: int | None = None):
    """A ``run`` that starts every command line with ``prefix`` (a subcommand), at a fixed width
    unless the call gives ``columns``."""
    return functools.partial(run, *prefix, columns=columns)


def whole_json(*args: str) -> dict:
    """flops --json: one object, its runs under "runs" (one per sparsity)."""
    r = run("flops", *args, "--json", columns=200)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


RUNNER = """
import sys
from sparsetool.cli.main import app
try:
    app(sys.argv[1:], prog_name="sparsetool")
    code = 0
except SystemExit as e:
    code = e.code
loaded = sorted(m.rsplit(".", 1)[1] for m in sys.modules
                if m.startswith("sparsetool.cli.") and not m.rsplit(".", 1)[1].startswith("_"))
sys.stdout.write(f"\\nloaded={','.join(loaded)}\\nexit={code} torch={'torch' in sys.modules}\\n")
"""


# ----------------------------------------------------------------------------- checkpoints
def gpt2_like_state(
    n_layer: int = 2,
    d: int = 16,
    vocab: int = 64,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """Tensors named like Hugging Face GPT-2 (Conv1D weights stored (in, out))."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    state = {"transformer.wte.weight": r(vocab, d), "transformer.wpe.weight": r(32, d)}
    for i in range(n_layer):
        p = f"transformer.h.{i}."
        state |= {
            p + "ln_1.weight": torch.ones(d, dtype=dtype),
            p + "ln_1.bias": torch.zeros(d, dtype=dtype),
            p + "attn.c_attn.weight": r(d, 3 * d),
            p + "attn.c_attn.bias": r(3 * d),
            p + "attn.c_proj.weight": r(d, d),
            p + "attn.c_proj.bias": r(d),
            p + "ln_2.weight": torch.ones(d, dtype=dtype),
            p + "ln_2.bias": torch.zeros(d, dtype=dtype),
            p + "mlp.c_fc.weight": r(d, 4 * d),
            p + "mlp.c_fc.bias": r(4 * d),
            p + "mlp.c_proj.weight": r(4 * d, d),
            p + "mlp.c_proj.bias": r(d),
        }
    state["transformer.ln_f.weight"] = torch.ones(d, dtype=dtype)
    state["transformer.ln_f.bias"] = torch.zeros(d, dtype=dtype)
    return state


TARGET_SUFFIXES = (
    "attn.c_attn.weight",
    "attn.c_proj.weight",
    "mlp.c_fc.weight",
    "mlp.c_proj.weight",
)


def is_gpt2_target(name: str) -> bool:
    return name.endswith(TARGET_SUFFIXES)


def pruned_gpt2(tmp_path, sparsity=0.75, encoding="zeros", n_layer=2, d=32, seed=0):
    """A GPT-2-like checkpoint with seeded random masks on the targeted (Conv1D, (in, out))
    weights."""
    from sparsetool.hardware import synthetic_mask

    state = gpt2_like_state(n_layer=n_layer, d=d, vocab=96, seed=seed)
    masks = {}
    for i, (name, w) in enumerate(sorted(state.items())):
        if is_gpt2_target(name):
            m = torch.from_numpy(synthetic_mask(tuple(w.shape), sparsity, seed=seed + i))
            state[name] = w * m
            masks[name] = m
            if encoding == "mask":
                state[name.replace(".weight", ".weight_mask")] = m
    path = tmp_path / "model.safetensors"
    save_file(state, str(path), metadata={"format": "pt"})
    return path, masks


def tensors(path: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        out |= load_file(str(f))
    return out


@contextlib.contextmanager
def tiny_chunks(on: bool = True):
    """Run the selection kernel's chunked, threaded path on small inputs: 7-key chunks, sorting
    only below 5 keys."""
    import sparsetool.masks.chunks as chunks
    import sparsetool.masks.kernel as kernel

    saved = chunks.CHUNK, kernel._SMALL
    if on:
        chunks.CHUNK, kernel._SMALL = 7, 4
    try:
        yield
    finally:
        chunks.CHUNK, kernel._SMALL = saved


# --------------------------------------------------------------------------- models, texts, corpora
def tiny_causal_lm(kind: str):
    """A small random transformers causal LM of ``kind`` ("opt", "gpt_neox" or "mistral"):
    2 layers, width 32, vocabulary 320, context 64 (tests that build one need transformers)."""
    import transformers as t

    if kind == "opt":
        return t.OPTForCausalLM(
            t.OPTConfig(
                num_hidden_layers=2,
                hidden_size=32,
                ffn_dim=64,
                num_attention_heads=4,
                vocab_size=320,
                max_position_embeddings=64,
                word_embed_proj_dim=32,
                bos_token_id=1,
                eos_token_id=1,
                pad_token_id=0,
            )
        )
    if kind == "gpt_neox":
        return t.GPTNeoXForCausalLM(
            t.GPTNeoXConfig(
                num_hidden_layers=2,
                hidden_size=32,
                intermediate_size=64,
                num_attention_heads=4,
                vocab_size=320,
                max_position_embeddings=64,
                bos_token_id=1,
                eos_token_id=1,
            )
        )
    if kind == "mistral":
        return t.MistralForCausalLM(
            t.MistralConfig(
                num_hidden_layers=2,
                hidden_size=32,
                intermediate_size=64,
                num_attention_heads=4,
                num_key_value_heads=2,
                vocab_size=320,
                max_position_embeddings=64,
                bos_token_id=1,
                eos_token_id=1,
                sliding_window=16,
            )
        )
    raise ValueError(f"no tiny model of kind {kind!r}")


def hf_model(kind: str):
    import transformers as t

    if kind == "gpt2":  # tied head
        return t.GPT2LMHeadModel(
            t.GPT2Config(
                n_layer=2,
                n_embd=32,
                n_head=4,
                vocab_size=320,
                n_positions=64,
                bos_token_id=1,
                eos_token_id=1,
            )
        )
    # "llama-tied": the head is the embedding (tie_word_embeddings), as in SmolLM2 and Llama-3.2-1B
    return t.LlamaForCausalLM(
        t.LlamaConfig(
            num_hidden_layers=2,
            hidden_size=32,
            intermediate_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=320,
            max_position_embeddings=64,
            bos_token_id=1,
            eos_token_id=1,
            pad_token_id=None,
            tie_word_embeddings=kind == "llama-tied",
        )
    )


TEXT_WORDS = [
    "the",
    "a",
    "sparse",
    "dense",
    "model",
    "weight",
    "mask",
    "prune",
    "layer",
    "token",
    "text",
    "of",
    "to",
    "and",
    "is",
    "in",
]
CALIB = dict(samples=6, seq=32)  # calibration windows small enough for the tiny models


def make_text(lines: int = 300, seed: int = 0) -> str:
    rng = random.Random(seed)
    return "\n".join(
        " ".join(rng.choice(TEXT_WORDS) for _ in range(rng.randint(3, 12))) for _ in range(lines)
    )


def save_tokenizer(directory: Path, text: str) -> None:
    """A byte-level BPE trained on ``text``, saved as transformers' fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        [text],
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<unk>", "<s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    import transformers

    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="<s>"
    )
    fast.save_pretrained(directory)


def save_sentencepiece_tokenizer(directory: Path, text: str, kind: str = "gemma") -> int:
    """A SentencePiece-style BPE (spaces as ``▁``, 256 ``<0xXX>`` byte tokens for byte fallback)
    trained on ``text`` and saved as transformers' own ``GemmaTokenizer`` (no leading ``▁``) or
    ``LlamaTokenizer`` (Llama 2's: a leading ``▁``) builds it; its size (the vocabulary and the
    tokens the class adds)."""
    import transformers
    from tokenizers import Tokenizer, models, normalizers, trainers

    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"] if kind == "gemma" else ["<unk>", "<s>", "</s>"]
    tok.train_from_iterator(
        [text],
        trainers.BpeTrainer(vocab_size=600, show_progress=False,
                            special_tokens=specials + [f"<0x{b:02X}>" for b in range(256)]),
    )  # fmt: skip
    data = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in data["merges"]]
    cls = transformers.GemmaTokenizer if kind == "gemma" else transformers.LlamaTokenizer
    built = cls(vocab=data["vocab"], merges=merges)
    built.save_pretrained(directory)
    return len(built)


CODE_WORDS = [
    "def",
    "class",
    "return",
    "import",
    "self",
    "value",
    "index",
    "sparse",
    "dense",
    "mask",
    "weight",
    "layer",
    "train",
    "loss",
    "step",
    "for",
    "in",
    "if",
    "else",
    "while",
    "print",
    "range",
    "len",
    "None",
    "True",
    "False",
]


def make_corpus(root: Path, files: int = 24, lines: int = 60, seed: int = 0) -> Path:
    """A few KB of Python-looking text in several files, reproducible from ``seed``."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        body = []
        for _ in range(lines):
            indent = "    " * rng.randint(0, 2)
            body.append(indent + " ".join(rng.choice(CODE_WORDS) for _ in range(rng.randint(2, 8))))
        (root / f"mod_{f:02d}.py").write_text("\n".join(body) + "\n")
    return root


# ----------------------------------------------------------------------------- measurements

# a cpu unlike the preset (every rate and overhead differs), whose times the fits must recover
TRUE_CPU = CPU(
    name="true",
    dense_flops=80e9,
    bandwidth=12e9,
    launch_s=8e-6,
    sparse_mac_rate=1.5e9,
    sparse_bandwidth=6e9,
    sparse_launch_s=25e-6,
)
BENCH_SHAPES = ((64, 64), (512, 512), (2048, 2048), (4096, 1024))
BENCH_BATCHES = (1, 8, 64, 512)


def bench_timing(t: float) -> dict:
    return {"median_s": t, "low_s": t * 0.98, "high_s": t * 1.02, "repeats": 7}


def bench_json(
    times=TRUE_CPU,
    shapes=BENCH_SHAPES,
    sparsities=(0.5, 0.9),
    batches=BENCH_BATCHES,
    noise=0.0,
    seed=0,
    kernels=("scipy-csr",),
    slower=None,
    device_type="cpu",
    dtype="float32",
    two_four=False,
) -> dict:
    """A measurement as ``sparsetool bench --json`` writes it (docs: the bench schema), built by
    hand: its dense and sparse times are ``times``' modelled forward times (a device of the model;
    each times ``exp(noise * N(0, 1))``, seeded); kernel ``slower[k]`` takes that many times
    longer."""
    import math

    import numpy as np

    from sparsetool.hardware.layers import LayerMask

    rng = np.random.default_rng(seed)
    slower = slower or {}
    layers = []
    for m, k in shapes:
        for s in sparsities:
            nnz = m * k - round(s * m * k)
            ly = LayerMask(f"{m}x{k}", "other", m, k, nnz)
            runs = []
            for b in batches:
                d = times.dense_cost(ly, b, "forward").total * math.exp(noise * rng.normal())
                sp = times.sparse_cost(ly, b, "forward").total * math.exp(noise * rng.normal())
                took = {kn: sp * slower.get(kn, 1.0) for kn in kernels}
                sparse = {
                    kn: {**bench_timing(t), "speedup": d / t, "max_abs_error": 1e-6, "ok": True}
                    for kn, t in took.items()
                }
                best = min(sparse, key=lambda kn: sparse[kn]["median_s"])
                runs.append(
                    {
                        "batch": b,
                        "dense": {**bench_timing(d), "kernel": "torch-linear"},
                        "sparse": sparse,
                        "best": best,
                        "best_speedup": sparse[best]["speedup"],
                    }
                )
            layers.append(
                {
                    "name": f"{m}x{k}",
                    "shape": [m, k],
                    "count": 1,
                    "nnz": nnz,
                    "sparsity": 1 - nnz / (m * k),
                    "two_four": two_four,
                    "runs": runs,
                }
            )
    return {
        "bench": 1,
        "device": {
            "type": device_type,
            "name": "Test CPU @ 2.5GHz",
            "threads": 2,
            "torch": "2.13.0",
            "scipy": "1.16.0",
        },
        "dtype": dtype,
        "source": "shape",
        "label": "hand-built",
        "batches": list(batches),
        "kernels": list(kernels),
        "layers": layers,
        "model": None,
        "break_even": None,
        "verdict": "hand-built for the tests",
    }
