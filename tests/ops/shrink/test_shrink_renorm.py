"""shrink --hidden with reconstruction: what reads an RMS norm over the hidden size (q/k/v,
gate/up) is refit to the kept channels as the narrower norm gives them (renormalised over
themselves), by least squares on the input model's activations.

- ``refit_renormed`` is the damped least-squares answer written out in numpy from the norm's own
  inputs, and its errors are the outputs' relative squared errors;
- block 0's and block 1's readers in the written model are the float64 answer computed here from
  the norm inputs hooked in transformers (the narrower norm written out: ``g_C h_C / rms_C(h)``);
- the refit model is closer to the input than the plain slice, alone and with --ffn/--heads;
- the refit is recorded (per reader and block), said in the result line and a note, and
  ``--no-reconstruct`` leaves the readers the plain slices.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers as t
from safetensors import safe_open

from sparsetool.ops.calibration import calibration_windows
from sparsetool.ops.shrink import ShrinkOptions, shrink_checkpoint
from sparsetool.ops.shrink.refit import DAMPENING
from sparsetool.ops.shrink.renorm import RenormStats, refit_renormed

from helpers import CALIB as WINDOWS
from helpers import make_text, run, save_tokenizer

# the tiny models' widths (hidden 32, FFN 48, head_dim 4-8) hold few multiples of 32: these
# tests take the exact fractions (test_shrink_multiple_of.py: the rounding)
CALIB = dict(WINDOWS, multiple_of=1)

EPS = 1e-5


def _narrow(h: np.ndarray, g: np.ndarray, kept: list[int], eps: float) -> np.ndarray:
    """The narrower RMS norm's output, written out: ``g_C h_C / sqrt(mean(h_C^2) + eps)``."""
    hk = h[:, kept]
    return g[kept] * hk / np.sqrt((hk * hk).mean(1, keepdims=True) + eps)


def _solve(w: np.ndarray, x: np.ndarray, xn: np.ndarray, damp: float) -> np.ndarray:
    """Damped least squares of ``xn V^T ~= x W^T`` written out."""
    a = xn.T @ xn
    a += damp * np.mean(np.diag(a)) * np.eye(len(a))
    return np.linalg.solve(a, xn.T @ (x @ w.T)).T


def test_refit_renormed_is_the_least_squares_answer():
    rng = np.random.default_rng(0)
    d, kept = 10, [0, 2, 3, 5, 8, 9]
    h = rng.normal(size=(500, d)) * rng.uniform(0.2, 3.0, size=d)
    g = rng.uniform(0.5, 1.5, size=d)
    x = g * h / np.sqrt((h * h).mean(1, keepdims=True) + EPS)
    w = rng.normal(size=(4, d))
    stats = RenormStats(torch.tensor(kept), EPS)
    for part in range(0, 500, 125):
        stats.add(torch.from_numpy(h[part : part + 125]), torch.from_numpy(x[part : part + 125]))
    xn = _narrow(h, g, kept, EPS)
    fit = refit_renormed(torch.from_numpy(w), stats, dampening=0.0)
    want = np.linalg.lstsq(xn, x @ w.T, rcond=None)[0].T
    np.testing.assert_allclose(fit.weight.numpy(), want, rtol=1e-8, atol=1e-9)
    y, norm = x @ w.T, float(((x @ w.T) ** 2).sum())
    plain = xn @ w[:, kept].T
    assert fit.error_before == pytest.approx(float(((y - plain) ** 2).sum()) / norm, rel=1e-8)
    refit = xn @ fit.weight.numpy().T
    assert fit.error_after == pytest.approx(float(((y - refit) ** 2).sum()) / norm, rel=1e-8)
    assert fit.error_after < fit.error_before
    damped = refit_renormed(torch.from_numpy(w), stats)
    np.testing.assert_allclose(damped.weight.numpy(), _solve(w, x, xn, DAMPENING), rtol=1e-8)


def _llama(directory, text) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = t.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=48,
                        num_attention_heads=8, num_key_value_heads=4, vocab_size=320,
                        max_position_embeddings=64, bos_token_id=1, eos_token_id=1,
                        rms_norm_eps=EPS)  # fmt: skip
    model = t.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # norms that are not all ones, and correlated channels (embeddings of
        # rank 12 of 32), as trained models have: what a refit can recover a random one lacks
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif p.ndim == 2 and "embed" not in name:  # blocks that change the residual
                p.normal_(0, p.shape[1] ** -0.5)
        emb = model.get_input_embeddings().weight
        emb.copy_(torch.randn(emb.shape[0], 12) @ torch.randn(12, emb.shape[1]) / 12)
    model.save_pretrained(directory)
    save_tokenizer(directory, text)
    return model


def _norm_io(model, path: str, windows) -> tuple[np.ndarray, np.ndarray]:
    """The inputs and outputs of the norm ``path`` over the windows (one forward each)."""
    ins, outs = [], []

    def hook(_m, args, out):
        ins.append(args[0].reshape(-1, args[0].shape[-1]).double())
        outs.append(out.reshape(-1, out.shape[-1]).double())

    handle = model.get_submodule(path).register_forward_hook(hook)
    with torch.no_grad():
        for row in windows:
            model(row.unsqueeze(0), use_cache=False)
    handle.remove()
    return torch.cat(ins).numpy(), torch.cat(outs).numpy()


def test_the_readers_are_refit_to_the_float64_answer(tmp_path, text, calib_file):
    model = _llama(tmp_path / "in", text)
    opts = ShrinkOptions(hidden=0.5, calibration=calib_file, **CALIB)
    result = shrink_checkpoint(tmp_path / "in", tmp_path / "out", opts)
    kept = result.widths.hidden.kept
    tok = t.AutoTokenizer.from_pretrained(tmp_path / "in")
    windows = calibration_windows(tok(text)["input_ids"], CALIB["samples"], CALIB["seq"], 0, "x")
    out = t.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    for i in (0, 1):
        for norm, readers in (
            ("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
            ("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj")),
        ):
            p = f"model.layers.{i}"
            h, x = _norm_io(model, f"{p}.{norm}", windows)
            g = model.get_submodule(f"{p}.{norm}").weight.detach().double().numpy()
            xn = _narrow(h, g, kept, EPS)
            for r in readers:
                w = model.get_submodule(f"{p}.{r}").weight.detach().double().numpy()
                got = out.get_submodule(f"{p}.{r}").weight.detach().double().numpy()
                np.testing.assert_allclose(got, _solve(w, x, xn, DAMPENING), rtol=1e-4, atol=1e-5)
    refit = result.widths.hidden.refit.to_json()
    assert refit["readers"] == ["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"]
    for layer in refit["layers"]:
        for r in refit["readers"]:
            assert 0 <= layer[r]["error_after"] < layer[r]["error_before"]


def _logit_error(model, directory) -> float:
    tok = t.AutoTokenizer.from_pretrained(directory)
    ids = torch.tensor(tok(make_text(60, seed=7))["input_ids"][:192]).view(4, 48)
    out = t.AutoModelForCausalLM.from_pretrained(directory).eval()
    with torch.no_grad():
        return float(
            ((out(ids, use_cache=False).logits - model(ids, use_cache=False).logits) ** 2).mean()
        )


@pytest.mark.parametrize("asked", [dict(hidden=0.5), dict(hidden=0.75, ffn=0.5, heads=0.5)])
def test_the_refit_model_is_closer_to_the_input_than_the_plain_slice(
    tmp_path, text, calib_file, asked
):
    model = _llama(tmp_path / "in", text)
    err = {}
    for rec in (True, False):
        opts = ShrinkOptions(calibration=calib_file, reconstruct=rec, **asked, **CALIB)
        shrink_checkpoint(tmp_path / "in", tmp_path / f"out-{rec}", opts)
        err[rec] = _logit_error(model, tmp_path / f"out-{rec}")
    assert err[True] < 0.8 * err[False], err


def test_the_refit_is_recorded_and_said_and_no_reconstruct_slices(tmp_path, text, calib_file):
    _llama(tmp_path / "in", text)
    args = ["shrink", tmp_path / "in", "--hidden", "0.5", "--calibration", calib_file]
    args += ["--samples", CALIB["samples"], "--seq", CALIB["seq"], "--multiple-of", 1]
    r = run(*args, "-o", tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert "readers of the narrower norms refit: q_proj, k_proj, v_proj, gate_proj, up_proj" in (
        r.stdout
    )
    assert "what reads each RMS norm is refit" in r.stdout and "not RMS norms" not in r.stdout
    assert "refit by least squares" not in r.stdout  # no --ffn/--heads: nothing else refit
    with safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as f:
        prov = json.loads(f.metadata()["sparsetool"])
    assert prov["widths"]["hidden"]["refit"]["error_after"] > 0
    assert "refit" not in prov["widths"]  # the FFN's and attention's: not asked
    r = run(*args, "-o", tmp_path / "plain", "--no-reconstruct", "--json")
    assert r.exit_code == 0, r.output
    kept = torch.tensor(json.loads(r.stdout)["widths"]["hidden"]["kept"])
    assert "refit" not in json.loads(r.stdout)["widths"]["hidden"]
    with (
        safe_open(str(tmp_path / "in" / "model.safetensors"), "pt") as src,
        safe_open(str(tmp_path / "plain" / "model.safetensors"), "pt") as dst,
    ):
        name = "model.layers.1.self_attn.q_proj.weight"
        assert torch.equal(dst.get_tensor(name), src.get_tensor(name).index_select(1, kept))


def test_per_head_norms_are_not_counted_as_norms_left_unrefit(tmp_path, text, calib_file):
    """Qwen3's q/k norms run over a head's width, not the hidden size: --hidden neither cuts nor
    reports them; every RMS norm over the hidden size has its readers refit."""
    torch.manual_seed(0)
    cfg = t.Qwen3Config(num_hidden_layers=2, hidden_size=32, intermediate_size=48,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=320,
                        max_position_embeddings=64, bos_token_id=1, eos_token_id=1)  # fmt: skip
    t.Qwen3ForCausalLM(cfg).eval().save_pretrained(tmp_path / "in")
    save_tokenizer(tmp_path / "in", text)
    opts = ShrinkOptions(hidden=0.5, calibration=calib_file, **CALIB)
    result = shrink_checkpoint(tmp_path / "in", tmp_path / "out", opts)
    refit = result.widths.hidden.refit.to_json()
    assert refit["not_refit"] == [] and not any("not RMS" in n for n in result.notes)
    assert refit["readers"] == ["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"]
    t.AutoModelForCausalLM.from_pretrained(tmp_path / "out")  # loads as it is
