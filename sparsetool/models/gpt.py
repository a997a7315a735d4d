"""sparsetool's GPT: a small byte-level GPT in one file (after nanoGPT's ``model.py``), its
config rebuilt from a checkpoint's shapes (:func:`infer_config`), and the run's model record
(:func:`model_record`).

Parameter names are a contract: ``sparsetool.targets`` recognises them (one more naming family
there, so the trainer, ``prune``, ``report`` and ``flops`` target the same four matrices) and
``report``/``flops`` read them from checkpoints.

=================================  ===========  ==========================================
name                               shape        notes
=================================  ===========  ==========================================
``tok_emb.weight``                 (V, d)       V = 256 bytes; never targeted
``pos_emb.weight``                 (ctx, d)     learned positions; never targeted
``blocks.N.ln1.weight/bias``       (d,)
``blocks.N.attn.qkv.weight``       (3d, d)      fused q, k, v; targeted
``blocks.N.attn.proj.weight``      (d, d)       attention output; targeted
``blocks.N.ln2.weight/bias``       (d,)
``blocks.N.mlp.fc.weight``         (4d, d)      FFN in; targeted
``blocks.N.mlp.proj.weight``       (d, 4d)      FFN out; targeted
``ln_f.weight/bias``               (d,)
``head.weight``                    (V, d)       untied from ``tok_emb``; never targeted
=================================  ===========  ==========================================

The LM head is *untied*: ``safetensors`` refuses to save shared storage, and an untied head keeps
every checkpoint a plain name -> tensor map that any tool can read. With V = 256 it costs only
``256 * d`` parameters. Linear layers have no bias (the seeds keep biases dense; having none makes
the targeted set exactly the four block matrices).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from sparsetool.checkpoint.provenance import merged_provenance
from sparsetool.errors import ConfigError
from sparsetool.targets import plan_targets

VOCAB_SIZE = 256  # bytes: no tokenizer to download, ever


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int = 2
    n_head: int = 2
    d_model: int = 32
    context: int = 64  # tokens per training sequence (the position table's length)
    vocab_size: int = VOCAB_SIZE
    dropout: float = 0.0  # 0 keeps runs bit-reproducible and is what small runs need

    def __post_init__(self) -> None:
        for field in ("n_layer", "n_head", "d_model", "context"):
            if getattr(self, field) < 1:
                raise ConfigError(f"model {field} must be >= 1, got {getattr(self, field)}")
        if self.d_model % self.n_head:
            raise ConfigError(
                f"d_model {self.d_model} is not divisible by n_head {self.n_head}; "
                "pick a width that is a multiple of the head count"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout}")

    def to_dict(self) -> dict:
        return asdict(self)


# Presets, smallest first. ``tiny`` is for tests (a training step takes milliseconds on CPU);
# ``base`` is ~10M parameters, the size a laptop CPU trains in minutes to hours.
PRESETS: dict[str, GPTConfig] = {
    "tiny": GPTConfig(n_layer=2, n_head=2, d_model=32, context=64),
    "mini": GPTConfig(n_layer=4, n_head=4, d_model=128, context=128),
    "small": GPTConfig(n_layer=6, n_head=8, d_model=256, context=256),
    "base": GPTConfig(n_layer=8, n_head=8, d_model=320, context=256),
}


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``attn_mask``: which tokens each token sees (bool, (B, 1, T, T), True: seen), for
        sequences packed behind a shared prefix; causal without it."""
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        # (B, nh, T, hs)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        # No mask buffer: is_causal lets the kernel build it, so DDP has no buffers to broadcast.
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=attn_mask,
            is_causal=attn_mask is None,
            dropout_p=self.dropout if self.training else 0.0,
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return F.dropout(self.proj(y), self.dropout, self.training)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=False)
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model, bias=False)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(self.proj(F.gelu(self.fc(x))), self.dropout, self.training)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), attn_mask)  # pre-LN, as GPT-2
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.context, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2 * n_layer)
        (GPT-2 paper section 2.3: "scale the weights of residual layers ... by 1/sqrt(N)")."""
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * self.cfg.n_layer))
            elif p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
            else:
                nn.init.ones_(p)

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ):
        """``idx``: (B, T) int64 bytes. Returns logits (B, T, V) and, with targets, the mean
        cross-entropy in nats per byte. ``positions``: each token's position (B, T) where it is
        not its index (sequences packed behind a shared prefix)."""
        B, T = idx.shape
        if self.cfg.context < T:
            raise ConfigError(
                f"sequence of {T} tokens exceeds the model context {self.cfg.context}"
            )
        pos = torch.arange(T, device=idx.device) if positions is None else positions
        x = self.tok_emb(idx) + self.pos_emb(pos)  # (B, T, d)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))  # (B, T, V)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def targeted_parameters(self) -> dict[str, nn.Parameter]:
        """The four weight matrices of each block (:func:`sparsetool.targets.plan_targets`).

        >>> list(GPT(PRESETS["tiny"]).targeted_parameters())[:4]
        ['blocks.0.attn.qkv.weight', 'blocks.0.attn.proj.weight', 'blocks.0.mlp.fc.weight',
        'blocks.0.mlp.proj.weight']
        """
        params = dict(self.named_parameters())
        plan = plan_targets((n, tuple(p.shape), p.dtype) for n, p in params.items())
        return {n: params[n] for n in plan.targeted}

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def infer_config(shapes: dict[str, tuple[int, ...]], n_head: int | None) -> GPTConfig:
    """Rebuild a GPTConfig from a checkpoint's tensor shapes.

    Heads cannot be read from shapes, so ``n_head`` comes from the checkpoint's metadata (or
    the caller's preset).

    >>> infer_config({"tok_emb.weight": (256, 32), "pos_emb.weight": (64, 32),
    ...               "blocks.0.ln1.weight": (32,), "blocks.1.ln1.weight": (32,)}, 2)
    GPTConfig(n_layer=2, n_head=2, d_model=32, context=64, vocab_size=256, dropout=0.0)
    """
    for needed in ("tok_emb.weight", "pos_emb.weight"):
        if needed not in shapes:
            raise ConfigError(
                f"tensor {needed!r} not found: this is not a checkpoint of sparsetool's GPT "
                "(train writes tok_emb/pos_emb/blocks.N.*/ln_f/head)"
            )
    vocab, d = shapes["tok_emb.weight"]
    context = shapes["pos_emb.weight"][0]
    layers = {int(n.split(".")[1]) for n in shapes if n.startswith("blocks.")}
    n_layer = max(layers) + 1 if layers else 0
    if n_head is None or d % n_head:
        raise ConfigError(
            f"cannot tell the head count of a width-{d} model; pass a --preset whose width "
            f"matches, or a checkpoint written by sparsetool train (it records n_head)"
        )
    return GPTConfig(n_layer=n_layer, n_head=n_head, d_model=d, context=context, vocab_size=vocab)


def model_record(ckpt) -> dict:
    """The sparsetool metadata of an open checkpoint, with the model's shape (``"model"``) from
    its config.json when the metadata lacks it. Later tools (prune, densify) keep earlier steps
    under "history": the model shape written by train survives them."""
    meta = merged_provenance(ckpt.metadata())
    if ckpt.config and "n_head" in ckpt.config and "model" not in meta:
        meta["model"] = {
            k: ckpt.config[k]
            for k in ("n_layer", "n_head", "d_model", "context")
            if k in ckpt.config
        }
    return meta
