"""shrink --ffn / --heads reconstruction (on by default): the projection that reads the kept
channels or heads is refit by least squares on the calibration activations.

- ``refit_columns`` is the least-squares answer numpy's ``lstsq`` gives (with and without a bias),
  and its errors are the layers' relative output errors computed from the activations;
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
from sparsetool.ops.shrink.refit import DAMPENING, Gram, refit_columns

from helpers import CALIB, run, save_tokenizer

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
    damped = refit_columns(w, gram, kept, bias=b)
    assert damped.error_after >= fit.error_after and damped.error_after < fit.error_before


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


def _least_squares(w: np.ndarray, x: np.ndarray, kept: list[int], bias=None):
    """Damped least squares written out: (X_K^T X_K + lambda I) W_K^T = X_K^T X W^T."""
    if bias is not None:
        x = np.concatenate([x, np.ones((len(x), 1))], 1)
        w = np.concatenate([w, bias[:, None]], 1)
        kept = [*kept, x.shape[1] - 1]
    xk = x[:, kept]
    h = xk.T @ xk
    h += DAMPENING * np.mean(np.diag(h)) * np.eye(len(kept))
    return np.linalg.solve(h, xk.T @ (x @ w.T)).T


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
        for path, kept in ((down, layer["ffn_kept"]), (o, rows)):
            w = model.get_submodule(path).weight.detach().double().numpy()
            want = _least_squares(w, xs[path].numpy(), kept)
            got = out.get_submodule(path).weight.detach().double().numpy()
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    else:  # GPT-2's Conv1D stores (in, out); its bias absorbs the removed channels' mean
        proj = "transformer.h.0.mlp.c_proj"
        x = _inputs_of(model, [proj], windows)[proj].numpy()
        m = model.get_submodule(proj)
        w, b = (v.detach().double().numpy() for v in (m.weight, m.bias))
        want = _least_squares(w.T, x, layer["ffn_kept"], b)
        got = out.get_submodule(proj)
        np.testing.assert_allclose(got.weight.detach().double().numpy().T, want[:, :-1],
                                   rtol=1e-4, atol=1e-5)  # fmt: skip
        np.testing.assert_allclose(got.bias.detach().double().numpy(), want[:, -1],
                                   rtol=1e-4, atol=1e-5)  # fmt: skip
    for rec in result.widths.layers:
        for key in ("ffn_refit", "o_refit"):
            if key in rec:
                assert 0 <= rec[key]["error_after"] < rec[key]["error_before"]


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
    calib = ["--calibration", calib_file, "--samples", "6", "--seq", "32"]
    r = run("shrink", tmp_path / "in", "-o", tmp_path / "out", "--ffn", "0.5", "--heads", "0.5",
            *calib)  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "refit by least squares: down_proj, o_proj (calibration error" in r.output
    r = run("shrink", tmp_path / "in", "-o", tmp_path / "json", "--ffn", "0.5", *calib, "--json")
    assert r.exit_code == 0, r.output
    widths = json.loads(r.stdout)["widths"]
    assert widths["refit"]["projections"] == ["down_proj"]
    assert widths["refit"]["dampening"] == DAMPENING
    assert widths["refit"]["error_after"] < widths["refit"]["error_before"]
    assert all("ffn_refit" in rec and "o_refit" not in rec for rec in widths["layers"])
    with safe_open(str(tmp_path / "json" / "model.safetensors"), "pt") as f:
        prov = json.loads(f.metadata()["sparsetool"])
    assert prov["reconstruct"] is True and prov["widths"]["refit"]["projections"] == ["down_proj"]
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
    assert fit.run == run and fit.folded_into == before
    assert 0 <= fit.error_after < fit.error_before
    tok = t.AutoTokenizer.from_pretrained(tmp_path / "in")
    windows = calibration_windows(tok(text)["input_ids"], CALIB["samples"], CALIB["seq"], 0, "x")
    h = model.transformer.h
    got = _outputs_of(model, {"m": h[before].mlp.c_proj, "a": h[before], "b": h[run[-1]]}, windows)
    m, y = got["m"].numpy(), (got["b"] - got["a"] + got["m"]).numpy()
    a = m.T @ m
    a += DAMPENING * np.mean(np.diag(a)) * np.eye(len(a))
    tmap = np.linalg.solve(a, m.T @ y)
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
    calib = ["--calibration", calib_file, "--samples", "6", "--seq", "32"]
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
    calib = ["--calibration", calib_file, "--samples", "6", "--seq", "32"]
    r = run("shrink", tmp_path / "in", "-o", tmp_path / "out", "--blocks", "2",
            "--block-criterion", "angular", *calib)  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "replaced by a least-squares map folded into block" in r.output, r.output
    r = run("shrink", tmp_path / "in", "-o", tmp_path / "plain", "--blocks", "2",
            "--block-criterion", "angular", *calib, "--no-reconstruct")  # fmt: skip
    assert r.exit_code == 0 and "least-squares map" not in r.output, r.output
