"""Write the small checkpoints the docs' examples use into the current directory.

    python examples/make_inputs.py

tiny.safetensors    a 2-layer GPT-2-named model, width 16 (8,128 parameters, random weights)
bad.safetensors     the same with 1 NaN and 2 infinite values in transformer.h.0.mlp.c_fc.weight
int.safetensors     a quantized model: every weight an integer or bool tensor
mixed.safetensors   float weights except the FFN input matrices, which are int8
"""

import torch
from safetensors.torch import save_file


def gpt2_like(n_layer: int = 2, d: int = 16, vocab: int = 64) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    state = {"transformer.wte.weight": r(vocab, d), "transformer.wpe.weight": r(32, d)}
    for i in range(n_layer):
        p = f"transformer.h.{i}."
        state |= {
            p + "ln_1.weight": torch.ones(d),
            p + "ln_1.bias": torch.zeros(d),
            p + "attn.c_attn.weight": r(d, 3 * d),
            p + "attn.c_attn.bias": r(3 * d),
            p + "attn.c_proj.weight": r(d, d),
            p + "attn.c_proj.bias": r(d),
            p + "ln_2.weight": torch.ones(d),
            p + "ln_2.bias": torch.zeros(d),
            p + "mlp.c_fc.weight": r(d, 4 * d),
            p + "mlp.c_fc.bias": r(4 * d),
            p + "mlp.c_proj.weight": r(4 * d, d),
            p + "mlp.c_proj.bias": r(d),
        }
    state["transformer.ln_f.weight"] = torch.ones(d)
    state["transformer.ln_f.bias"] = torch.zeros(d)
    return state


def quantized(float_except_ffn_in: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    state = {}
    for i in range(2):
        p = f"h.{i}."
        if float_except_ffn_in:
            state[p + "attn.c_attn.weight"] = torch.randn(8, 24, generator=g)
            state[p + "attn.c_proj.weight"] = torch.randn(8, 8, generator=g)
            state[p + "mlp.c_fc.weight"] = torch.randint(-3, 3, (8, 32), generator=g).to(torch.int8)
            state[p + "mlp.c_proj.weight"] = torch.randn(32, 8, generator=g)
        else:
            state[p + "attn.c_attn.weight"] = torch.randint(-3, 3, (8, 24), generator=g).to(
                torch.int8
            )
            state[p + "attn.c_proj.weight"] = torch.randint(-3, 3, (8, 8), generator=g)  # int64
            state[p + "mlp.c_fc.weight"] = torch.randint(0, 3, (8, 32), generator=g).to(torch.uint8)
            state[p + "mlp.c_proj.weight"] = torch.randint(0, 2, (32, 8), generator=g).bool()
    return state


tiny = gpt2_like()
save_file(tiny, "tiny.safetensors", metadata={"format": "pt"})
bad = {k: v.clone() for k, v in tiny.items()}
flat = bad["transformer.h.0.mlp.c_fc.weight"].view(-1)
flat[0] = float("nan")
flat[1] = float("inf")
flat[2] = -float("inf")
save_file(bad, "bad.safetensors", metadata={"format": "pt"})
save_file(quantized(False), "int.safetensors")
save_file(quantized(True), "mixed.safetensors")
print("wrote tiny.safetensors, bad.safetensors, int.safetensors, mixed.safetensors")
