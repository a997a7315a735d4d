"""shrink --ffn / --heads reconstruction (on by default): the projection that reads the kept
channels or heads is refit by least squares on the calibration activations.

- ``refit_columns`` is the least-squares answer numpy's ``lstsq`` gives (with and without a bias),
  and its errors are the layers' relative output errors computed from the activations;
- with held-back inputs, the damping (toward the plain slice) is the one of least held-back
  error, computed here from the activations, the weights are refit on every input with it, and
  where no damping beats the plain slice on the held-back inputs the plain slice is kept bit for
  bit; ReplaceMe's map alike, toward the identity;
- block 0 (whose inputs are the original model's) is refit to the float64 answer computed here
  from activations hooked in transformers, Llama's down and output projections and GPT-2's FFN
  with its bias;
- the refit model is closer to the input model than the plain slice on held-out windows;
- ``--no-reconstruct`` writes the plain slices bit for bit; the refit's errors are in the record,
  the provenance, ``--json`` and the result line;
- ``--blocks``: each removed run's ReplaceMe map is the float64 least-squares answer from
  activations hooked in transformers, folded into the down projection (and bias) of the block
  before it; the mapped model is closer to the input than the blocks just removed; a run from
  block 0 and a block with a post-FFN norm are said, not refit.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers as t
from safetensors import safe_open

from sparsetool.errors import SparsetoolError
from sparsetool.ops.shrink import ShrinkOptions, shrink_checkpoint
from sparsetool.ops.shrink.refit import (
    DAMPINGS,
    Gram,
    RunMap,
    choose_map,
    is_held,
    refit_columns,
)

from helpers import CALIB as WINDOWS
from helpers import run, save_tokenizer

# the tiny models' widths (hidden 32, FFN 48, head_dim 4-8) hold few multiples of 32: these
# tests take the exact fractions (test_shrink_multiple_of.py: the rounding)
CALIB = dict(WINDOWS, multiple_of=1)

_SMALL = dict(vocab_size=320, max_position_embeddings=64, bos_token_id=1, eos_token_id=1)


def build(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "llama":
        cfg = t.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=48,
                            num_attention_heads=8, num_key_value_heads=4, **_SMALL)  # fmt: skip
        return t.LlamaForCausalLM(cfg).eval()
    cfg = t.GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=64, vocab_size=320,
                       bos_token_id=1, eos_token_id=1)  # fmt: skip
    return t.GPT2LMHeadModel(cfg).eval()


def save(kind, directory, text) -> torch.nn.Module:
    model = build(kind)
    model.save_pretrained(directory)
    save_tokenizer(directory, text)
    return model


# ----------------------------------------------------------------------------- the solve
@pytest.mark.parametrize("with_bias", [False, True])
def test_refit_columns_is_the_least_squares_answer(with_bias):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 12, generator=g, dtype=torch.float64) + 0.5  # a mean, for the bias
    w = torch.randn(5, 12, generator=g, dtype=torch.float64)
    b = torch.randn(5, generator=g, dtype=torch.float64) if with_bias else None
    kept = [0, 2, 3, 7, 8, 11]
    gram = Gram()
    for part in x.split(100):
        gram.add(part)
    fit = refit_columns(w, gram, kept, bias=b, dampening=0.0)
    y = x @ w.T + (0 if b is None else b)
    a = x[:, kept].numpy()
    if with_bias:
        a = np.concatenate([a, np.ones((len(a), 1))], 1)
    sol = np.linalg.lstsq(a, y.numpy(), rcond=None)[0].T
    np.testing.assert_allclose(fit.weight.numpy(), sol[:, : len(kept)], rtol=1e-9, atol=1e-9)
    if with_bias:
        assert fit.bias is not None
        np.testing.assert_allclose(fit.bias.numpy(), sol[:, -1], rtol=1e-9, atol=1e-9)
    # the errors are the outputs' relative squared errors, from the activations themselves
    plain = x[:, kept] @ w[:, kept].T + (0 if b is None else b)
    refit = x[:, kept] @ fit.weight.T + (0 if fit.bias is None else fit.bias)
    norm = float((y**2).sum())
    assert fit.error_before == pytest.approx(float(((y - plain) ** 2).sum()) / norm, rel=1e-9)
    assert fit.error_after == pytest.approx(float(((y - refit) ** 2).sum()) / norm, rel=1e-9)
    assert fit.error_after < fit.error_before
    # dampening pulls the answer toward zero, a little
    damped = refit_columns(w, gram, kept, bias=b, dampening=0.01)
    assert damped.error_after >= fit.error_after and damped.error_after < fit.error_before
    # with nothing held back and no damping asked, nothing can check a refit: the plain slice
    plain = refit_columns(w, gram, kept, bias=b)
    assert plain.kept_plain and torch.equal(plain.weight, w[:, kept])
    assert plain.error_after == plain.error_before


def _grams(x: torch.Tensor) -> Gram:
    gram = Gram()
    for part in x.split(50):
        gram.add(part)
    return gram


def _toward_plain(w, x, kept, damping, bias=None):
    """The damped least squares toward the plain slice, written out from the activations:
    W_K (X_K^T X_K + lambda I) = W X^T X_K + lambda W_K."""
    w, x = w.numpy(), x.numpy()
    if bias is not None:
        x = np.concatenate([x, np.ones((len(x), 1))], 1)
        w = np.concatenate([w, bias.numpy()[:, None]], 1)
        kept = [*kept, x.shape[1] - 1]
    xk = x[:, kept]
    h = xk.T @ xk
    lam = damping * np.mean(np.diag(h))
    return np.linalg.solve(h + lam * np.eye(len(kept)), xk.T @ (x @ w.T) + lam * w[:, kept].T).T


def _output_error(w, x, kept, fitted, bias=None) -> float:
    """sum_t ||W x + b - W_K x_K - b'||^2 / sum_t ||W x + b||^2, from the activations."""
    w, x = w.numpy(), x.numpy()
    y = x @ w.T + (0 if bias is None else bias.numpy())
    got = x[:, kept] @ fitted[:, : len(kept)].T + (0 if bias is None else fitted[:, -1])
    return float(((y - got) ** 2).sum() / (y**2).sum())


@pytest.mark.parametrize("with_bias", [False, True])
def test_the_damping_is_chosen_on_held_back_inputs_toward_the_plain_slice(with_bias):
    g = torch.Generator().manual_seed(1)
    mix = torch.randn(12, 12, generator=g, dtype=torch.float64)  # correlated channels
    x = torch.randn(300, 12, generator=g, dtype=torch.float64) @ mix + 0.3
    w = torch.randn(5, 12, generator=g, dtype=torch.float64)
    b = torch.randn(5, generator=g, dtype=torch.float64) if with_bias else None
    kept = [0, 2, 3, 7, 8, 11]
    fit_x, held_x = x[:60], x[60:]  # few tokens to fit on: the dampings differ
    fit = refit_columns(w, _grams(fit_x), kept, bias=b, held=_grams(held_x))
    errors = {
        d: _output_error(w, held_x, kept, _toward_plain(w, fit_x, kept, d, b), b) for d in DAMPINGS
    }
    plain = np.concatenate([w[:, kept].numpy()] + ([b.numpy()[:, None]] if with_bias else []), 1)
    assert fit.held_before == pytest.approx(_output_error(w, held_x, kept, plain, b), rel=1e-8)
    best = min(errors, key=errors.get)
    assert errors[best] < fit.held_before and not fit.kept_plain
    assert fit.damping == best and fit.held_after == pytest.approx(errors[best], rel=1e-8)
    want = _toward_plain(w, x, kept, best, b)  # refit on every input with the damping chosen
    np.testing.assert_allclose(fit.weight.numpy(), want[:, : len(kept)], rtol=1e-8, atol=1e-10)
    if with_bias:
        np.testing.assert_allclose(fit.bias.numpy(), want[:, -1], rtol=1e-8, atol=1e-10)
    assert fit.record()["damping"] == best and fit.record()["kept_plain"] is False


def test_a_refit_no_damping_helps_on_held_back_inputs_keeps_the_plain_slice():
    g = torch.Generator().manual_seed(2)
    base = torch.randn(400, 6, generator=g, dtype=torch.float64)
    # the fit's removed channel copies kept channel 0; the held-back one is its opposite, so
    # whatever the refit learns from that correlation costs more on the held-back inputs
    fit_x = torch.cat([base[:200], base[:200, :1]], 1)
    held_x = torch.cat([base[200:], -base[200:, :1]], 1)
    w = torch.randn(4, 7, generator=g, dtype=torch.float64)
    kept = [0, 1, 2, 3, 4, 5]
    fit = refit_columns(w, _grams(fit_x), kept, held=_grams(held_x))
    assert fit.kept_plain and fit.damping is None
    assert torch.equal(fit.weight, w[:, kept])  # bit for bit the plain slice
    assert fit.held_after == fit.held_before > 0
    assert fit.error_after == fit.error_before
    assert fit.record()["kept_plain"] is True


def test_the_map_is_chosen_toward_the_identity_and_kept_out_where_it_does_not_help():
    g = torch.Generator().manual_seed(3)
    d = 8
    m = torch.randn(240, d, generator=g, dtype=torch.float64)
    before = torch.randn(240, d, generator=g, dtype=torch.float64)
    noise = torch.randn(d, d, generator=g, dtype=torch.float64)
    true_t = torch.eye(d, dtype=torch.float64) + 0.3 * noise
    after = before - m + m @ true_t + 0.05 * torch.randn(240, d, generator=g, dtype=torch.float64)
    fit, held = RunMap(), RunMap()
    for i, rows in enumerate(torch.arange(240).split(20)):
        (held if is_held(i, 12) else fit).add(m[rows], before[rows], after[rows])
    choice = choose_map(fit, held)
    assert choice.t is not None and choice.damping in DAMPINGS
    assert choice.held_after < choice.held_before and choice.error_after < choice.error_before
    every = fit.merged(held)
    lam = choice.damping * float(torch.diagonal(every.mtm).mean())
    eye = torch.eye(d, dtype=torch.float64)
    want = torch.linalg.solve(every.mtm + lam * eye, every.mty + lam * eye)
    torch.testing.assert_close(choice.t, want, rtol=1e-10, atol=1e-12)
    # the held-back tokens' blocks do the opposite of the fitted ones': no map is kept
    fit, held = RunMap(), RunMap()
    fit.add(m[:120], before[:120], after[:120])
    held.add(m[120:], before[120:], before[120:] + (before[120:] - after[120:]))
    choice = choose_map(fit, held)
    assert choice.t is None and choice.damping is None
    assert choice.held_after == choice.held_before and choice.error_after == choice.error_before


# ----------------------------------------------------------------------------- in the model
def _inputs_of(model, paths: list[str], windows) -> dict[str, torch.Tensor]:
    """The inputs of the modules ``paths``, float64, over the windows (one forward each)."""
    seen: dict[str, list] = {p: [] for p in paths}

    def hook(p):
        return lambda _m, args: seen[p].append(args[0].reshape(-1, args[0].shape[-1]).double())

    handles = [model.get_submodule(p).register_forward_pre_hook(hook(p)) for p in paths]
    with torch.no_grad():
        for row in windows:
            model(row.unsqueeze(0), use_cache=False)
    for h in handles:
        h.remove()
    return {p: torch.cat(v) for p, v in seen.items()}


def _least_squares(w: np.ndarray, x: np.ndarray, kept: list[int], fit: dict, bias=None):
    """What block 0's refit record says was kept, written out from the activations: the plain
    slice, or the least squares damped toward it with the damping chosen."""
    if fit["kept_plain"]:
        plain = w[:, kept]
        return plain if bias is None else np.concatenate([plain, bias[:, None]], 1)
    return _toward_plain(
        torch.from_numpy(w), torch.from_numpy(x), kept, fit["damping"],
        None if bias is None else torch.from_numpy(bias),
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_block_0_is_refit_to_the_float64_least_squares_answer(kind, tmp_path, text, calib_file):
    from sparsetool.ops.calibration import calibration_windows

    model = save(kind, tmp_path / "in", text)
    asked = dict(ffn=0.5, heads=0.5) if kind == "llama" else dict(ffn=0.5)
    result = shrink_checkpoint(
        tmp_path / "in", tmp_path / "out", ShrinkOptions(calibration=calib_file, **asked, **CALIB)
    )
    layer = result.widths.layers[0]
    tok = t.AutoTokenizer.from_pretrained(tmp_path / "in")
    windows = calibration_windows(tok(text)["input_ids"], CALIB["samples"], CALIB["seq"], 0, "x")
    out = t.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    if kind == "llama":
        down, o = "model.layers.0.mlp.down_proj", "model.layers.0.self_attn.o_proj"
        xs = _inputs_of(model, [down, o], windows)
        hd = 4
        rows = [h * hd + d for h in layer["heads_kept"] for d in range(hd)]
        for path, kept, key in ((down, layer["ffn_kept"], "ffn_refit"), (o, rows, "o_refit")):
            w = model.get_submodule(path).weight.detach().double().numpy()
            want = _least_squares(w, xs[path].numpy(), kept, layer[key])
            got = out.get_submodule(path).weight.detach().double().numpy()
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    else:  # GPT-2's Conv1D stores (in, out); its bias absorbs the removed channels' mean
        proj = "transformer.h.0.mlp.c_proj"
        x = _inputs_of(model, [proj], windows)[proj].numpy()
        m = model.get_submodule(proj)
        w, b = (v.detach().double().numpy() for v in (m.weight, m.bias))
        want = _least_squares(w.T, x, layer["ffn_kept"], layer["ffn_refit"], b)
        got = out.get_submodule(proj)
        np.testing.assert_allclose(got.weight.detach().double().numpy().T, want[:, :-1],
                                   rtol=1e-4, atol=1e-5)  # fmt: skip
        np.testing.assert_allclose(got.bias.detach().double().numpy(), want[:, -1],
                                   rtol=1e-4, atol=1e-5)  # fmt: skip
    refit = 0
    for rec in result.widths.layers:
        for key in ("ffn_refit", "o_refit"):
            if key in rec:
                fit = rec[key]
                assert 0 <= fit["held_after"] <= fit["held_before"]
                if fit["kept_plain"]:
                    assert fit["held_after"] == fit["held_before"] and fit["damping"] is None
                else:
                    assert fit["held_after"] < fit["held_before"] and fit["damping"] in DAMPINGS
                    assert fit["error_after"] < fit["error_before"]
                    refit += 1
    assert refit, "a random model's cut is refit somewhere"


def _logit_error(model, tmp_path, rec: bool) -> float:
    """The mean squared difference of ``out-{rec}``'s logits from ``model``'s, on held-out text."""
    from helpers import make_text

    tok = t.AutoTokenizer.from_pretrained(tmp_path / "in")
    ids = torch.tensor(tok(make_text(60, seed=7))["input_ids"][:192]).view(4, 48)
    out = t.AutoModelForCausalLM.from_pretrained(tmp_path / f"out-{rec}").eval()
    with torch.no_grad():
        return float(
            ((out(ids, use_cache=False).logits - model(ids, use_cache=False).logits) ** 2).mean()
        )


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_the_refit_model_is_closer_to_the_input_than_the_plain_slice(kind, tmp_path, text,
                                                                     calib_file):  # fmt: skip
    model = save(kind, tmp_path / "in", text)
    asked = dict(ffn=0.5, heads=0.5) if kind == "llama" else dict(ffn=0.5)
    for rec in (True, False):
        opts = ShrinkOptions(calibration=calib_file, reconstruct=rec, **asked, **CALIB)
        shrink_checkpoint(tmp_path / "in", tmp_path / f"out-{rec}", opts)
    err = {rec: _logit_error(model, tmp_path, rec) for rec in (True, False)}
    assert err[True] < 0.8 * err[False], err


def test_no_reconstruct_writes_the_plain_slices_bit_for_bit(tmp_path, text, calib_file):
    save("llama", tmp_path / "in", text)
    opts = ShrinkOptions(ffn=0.5, heads=0.5, calibration=calib_file, reconstruct=False, **CALIB)
    result = shrink_checkpoint(tmp_path / "in", tmp_path / "out", opts)
    with (
        safe_open(str(tmp_path / "in" / "model.safetensors"), "pt") as src,
        safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as dst,
    ):
        for i, layer in enumerate(result.widths.layers):
            c = torch.tensor(layer["ffn_kept"])
            rows = torch.tensor([h * 4 + d for h in layer["heads_kept"] for d in range(4)])
            p = f"model.layers.{i}"
            for name, axis, keep in [
                (f"{p}.mlp.down_proj.weight", 1, c),
                (f"{p}.mlp.gate_proj.weight", 0, c),
                (f"{p}.self_attn.o_proj.weight", 1, rows),
                (f"{p}.self_attn.q_proj.weight", 0, rows),
            ]:
                want = src.get_tensor(name).index_select(axis, keep)
                assert torch.equal(dst.get_tensor(name), want), name
    assert result.widths.refit is None
    assert all("ffn_refit" not in rec for rec in result.widths.layers)


def test_the_refit_tensors_wait_on_disk_and_nothing_is_left_beside_the_output(
    tmp_path, text, calib_file
):
    save("llama", tmp_path / "in", text)
    opts = ShrinkOptions(ffn=0.5, heads=0.5, calibration=calib_file, **CALIB)
    shrink_checkpoint(tmp_path / "in", tmp_path / "out", opts)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"]
    with pytest.raises(SparsetoolError):  # fails after the spill is made: nothing is left
        shrink_checkpoint(tmp_path / "in", tmp_path / "bad",
                          ShrinkOptions(ffn=0.5, calibration=tmp_path / "in" / "config.json",
                                        samples=2000, seq=32))  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"]


def test_the_refit_is_recorded_and_said(tmp_path, text, calib_file):
    save("llama", tmp_path / "in", text)
    calib = ["--calibration", calib_file, "--samples", "6", "--seq", "32", "--multiple-of", "1"]
    r = run("shrink", tmp_path / "in", "-o", tmp_path / "out", "--ffn", "0.5", "--heads", "0.5",
            *calib)  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "refit by least squares: down_proj, o_proj (held-back error " in r.output
    assert "mean over layers; " in r.output and " of 4 projections kept plain)" in r.output
    r = run("shrink", tmp_path / "in", "-o", tmp_path / "json", "--ffn", "0.5", *calib, "--json")
    assert r.exit_code == 0, r.output
    widths = json.loads(r.stdout)["widths"]
    refit = widths["refit"]
    assert refit["projections"] == ["down_proj"] and refit["dampening"] is None
    assert refit["dampings"] == list(DAMPINGS) and refit["held_back_windows"] == 1  # 6 windows
    assert refit["held_after"] <= refit["held_before"]
    assert refit["layers_refit"] + refit["layers_kept_plain"] == 2
    assert all("ffn_refit" in rec and "o_refit" not in rec for rec in widths["layers"])
    for rec in widths["layers"]:
        assert set(rec["ffn_refit"]) == {"error_before", "error_after", "held_before",
                                         "held_after", "damping", "kept_plain"}  # fmt: skip
    with safe_open(str(tmp_path / "json" / "model.safetensors"), "pt") as f:
        prov = json.loads(f.metadata()["sparsetool"])
    assert prov["reconstruct"] is True and prov["widths"]["refit"]["projections"] == ["down_proj"]
    assert prov["widths"]["layers"][0]["ffn_refit"] == widths["layers"][0]["ffn_refit"]
    r = run("shrink", tmp_path / "in", "-o", tmp_path / "one", "--ffn", "0.5", "--calibration",
            calib_file, "--samples", "1", "--seq", "32")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "every layer kept plain: one calibration window, none held back" in r.output
    r = run("shrink", tmp_path / "in", "-o", tmp_path / "plain", "--ffn", "0.5", *calib,
            "--no-reconstruct")  # fmt: skip
    assert r.exit_code == 0 and "refit by least squares" not in r.output, r.output
    r = run("shrink", tmp_path / "in", "-o", tmp_path / "hidden", "--ffn", "0.5", "--hidden",
            "0.75", *calib)  # fmt: skip
    assert r.exit_code == 0 and "what reads each RMS norm is refit" in r.output, r.output


# ----------------------------------------------------------------------------- --blocks
def _deep(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = t.GPT2Config(n_layer=6, n_embd=32, n_head=4, n_positions=64, vocab_size=320,
                           bos_token_id=1, eos_token_id=1)  # fmt: skip
        return t.GPT2LMHeadModel(cfg).eval()
    if kind == "gemma3":
        cfg = t.Gemma3TextConfig(num_hidden_layers=6, hidden_size=32, intermediate_size=48,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                 sliding_window=8, **_SMALL)  # fmt: skip
        return t.Gemma3ForCausalLM(cfg).eval()
    cfg = t.LlamaConfig(num_hidden_layers=6, hidden_size=32, intermediate_size=64,
                        num_attention_heads=4, num_key_value_heads=2, **_SMALL)  # fmt: skip
    return t.LlamaForCausalLM(cfg).eval()


def _outputs_of(model, modules: dict[str, torch.nn.Module], windows) -> dict[str, torch.Tensor]:
    """The outputs of ``modules`` (name -> module), float64, over the windows."""
    seen: dict[str, list] = {n: [] for n in modules}

    def hook(n):
        def see(_m, _args, out):
            y = out[0] if isinstance(out, tuple) else out
            seen[n].append(y.reshape(-1, y.shape[-1]).double())

        return see

    handles = [m.register_forward_hook(hook(n)) for n, m in modules.items()]
    with torch.no_grad():
        for row in windows:
            model(row.unsqueeze(0), use_cache=False)
    for h in handles:
        h.remove()
    return {n: torch.cat(v) for n, v in seen.items()}


def test_a_removed_run_is_replaced_by_its_least_squares_map(tmp_path, text, calib_file):
    from sparsetool.ops.calibration import calibration_windows

    model = _deep("gpt2")
    model.save_pretrained(tmp_path / "in")
    save_tokenizer(tmp_path / "in", text)
    opts = ShrinkOptions(blocks=2, block_criterion="angular", calibration=calib_file, **CALIB)
    result = shrink_checkpoint(tmp_path / "in", tmp_path / "out", opts)
    run = result.blocks.removed
    assert run[0] > 0, "this model's angular run must leave a block before it"
    (fit,) = result.blocks.reconstruct.maps
    before = run[0] - 1
    assert fit.run == run and fit.folded_into == before and not fit.kept_plain
    assert 0 <= fit.error_after < fit.error_before and fit.held_after < fit.held_before
    tok = t.AutoTokenizer.from_pretrained(tmp_path / "in")
    windows = calibration_windows(tok(text)["input_ids"], CALIB["samples"], CALIB["seq"], 0, "x")
    h = model.transformer.h
    got = _outputs_of(model, {"m": h[before].mlp.c_proj, "a": h[before], "b": h[run[-1]]}, windows)
    m, y = got["m"].numpy(), (got["b"] - got["a"] + got["m"]).numpy()
    a = m.T @ m
    lam = fit.damping * np.mean(np.diag(a))
    tmap = np.linalg.solve(a + lam * np.eye(len(a)), m.T @ y + lam * np.eye(len(a)))
    src = h[before].mlp.c_proj
    out = t.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    dst = out.transformer.h[before].mlp.c_proj  # blocks before the run keep their numbers
    w = src.weight.detach().double().numpy()  # Conv1D: (d_ff, d), y = x W + b
    np.testing.assert_allclose(dst.weight.detach().double().numpy(), w @ tmap, rtol=1e-4,
                               atol=1e-5)  # fmt: skip
    b = src.bias.detach().double().numpy()
    np.testing.assert_allclose(dst.bias.detach().double().numpy(), b @ tmap, rtol=1e-4, atol=1e-5)
    # every other kept tensor is the input's
    for i in range(len(out.transformer.h)):
        for name, p in out.transformer.h[i].named_parameters():
            if i != before or "c_proj" not in name or "mlp" not in name:
                j = i if i < run[0] else i + len(run)
                assert torch.equal(p, model.transformer.h[j].get_parameter(name)), (i, name)


@pytest.mark.parametrize("kind, criterion", [("gpt2", "bi"), ("llama", "bi")])
def test_mapped_blocks_are_closer_to_the_input_than_blocks_just_removed(
    kind, criterion, tmp_path, text, calib_file
):
    model = _deep(kind)
    model.save_pretrained(tmp_path / "in")
    save_tokenizer(tmp_path / "in", text)
    for rec in (True, False):
        opts = ShrinkOptions(blocks=2, block_criterion=criterion, calibration=calib_file,
                             reconstruct=rec, **CALIB)  # fmt: skip
        result = shrink_checkpoint(tmp_path / "in", tmp_path / f"out-{rec}", opts)
        if rec:
            assert result.blocks.reconstruct.maps, result.blocks
    err = {rec: _logit_error(model, tmp_path, rec) for rec in (True, False)}
    assert err[True] < err[False], err


def test_runs_that_cannot_take_a_map_are_said(tmp_path, text, calib_file):
    _deep("gemma3").save_pretrained(tmp_path / "gemma")  # a norm after every FFN
    save_tokenizer(tmp_path / "gemma", text)
    calib = ["--calibration", calib_file, "--samples", "6", "--seq", "32", "--multiple-of", "1"]
    r = run("shrink", tmp_path / "gemma", "-o", tmp_path / "g", "--blocks", "2", *calib, "--json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    rec = got["blocks"]["reconstruct"]
    assert rec["maps"] == [] and len(rec["not_refit"]) >= 1
    assert all(n["run"][0] == 0 or "norm" in n["why"] for n in rec["not_refit"])
    r = run("shrink", tmp_path / "gemma", "-o", tmp_path / "g2", "--blocks", "2", *calib)
    assert r.exit_code == 0 and "note: removed blocks" in r.output, r.output
    assert any("are not refit" in note for note in got["notes"])
    _deep("llama").save_pretrained(tmp_path / "llama")
    save_tokenizer(tmp_path / "llama", text)
    r = run("shrink", tmp_path / "llama", "-o", tmp_path / "l", "--blocks", "1",
            "--block-criterion", "angular", *calib, "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    rec = json.loads(r.stdout)["blocks"]["reconstruct"]
    for n in rec["not_refit"]:
        assert n["run"][0] == 0 and "block 0" in n["why"]


def test_the_map_is_said_in_the_result_line(tmp_path, text, calib_file):
    _deep("gpt2").save_pretrained(tmp_path / "in")
    save_tokenizer(tmp_path / "in", text)
    calib = ["--calibration", calib_file, "--samples", "6", "--seq", "32", "--multiple-of", "1"]
    r = run("shrink", tmp_path / "in", "-o", tmp_path / "out", "--blocks", "2",
            "--block-criterion", "angular", *calib)  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "replaced by a least-squares map folded into block" in r.output, r.output
    r = run("shrink", tmp_path / "in", "-o", tmp_path / "plain", "--blocks", "2",
            "--block-criterion", "angular", *calib, "--no-reconstruct")  # fmt: skip
    assert r.exit_code == 0 and "least-squares map" not in r.output, r.output
