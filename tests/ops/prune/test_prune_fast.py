"""prune's fast path (scan once, write chunk by chunk), the worker pool and the torch-free readers.

The fast path must write the same bytes as the general path, and both must equal a sort-based
reference: exact counts, ties to the lower flat index (to the earlier tensor across tensors),
-0.0 a zero, never a weight revived; inf and NaN refused the same way.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from sparsetool.errors import SparsetoolError
from sparsetool.ops.densify import densify_checkpoint
from sparsetool.ops.prune import PruneOptions, prune_checkpoint
from sparsetool.ops.prune import magnitude as prune_module
from sparsetool.ops.report import summarize
from sparsetool.util import workers

from helpers import gpt2_like_state, tiny_chunks

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64]
DTYPES += [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]


@pytest.fixture(autouse=True)
def default_workers():
    yield
    workers.set_workers(None)


def pool_of(dtype: torch.dtype) -> list[float]:
    """Values with many ties, both zeros, subnormals and the extremes of ``dtype``."""
    info = torch.finfo(dtype)
    return [
        0.0,
        -0.0,
        info.tiny,
        -info.tiny,
        info.tiny / 2,
        -info.tiny / 4,
        info.max,
        -info.max,
        1.0,
        -1.0,
        0.5,
        -0.5,
        2.0,
        -2.0,
        1.0 + info.eps,
        3.0,
        -0.25,
    ]


def general_path(monkeypatch) -> None:
    """Make prune take the general path (read, mask, encode, write) for every tensor."""
    monkeypatch.setattr(prune_module.MagnitudePlanner, "stream", lambda self, lt, sw: None)


def reference(tensors: list[torch.Tensor], keep: int) -> list[torch.Tensor]:
    """Masks keeping the ``keep`` largest non-zero |w| over the tensors pooled in order (one
    tensor: layer scope), ties to the earlier tensor then the lower flat index."""
    values = [abs(v) for t in tensors for v in t.double().reshape(-1).tolist()]
    order = sorted((i for i, v in enumerate(values) if v != 0), key=lambda i: (-values[i], i))
    flat = torch.zeros(len(values), dtype=torch.bool)
    flat[order[:keep]] = True
    out, start = [], 0
    for t in tensors:
        out.append(flat[start : start + t.numel()].reshape(t.shape))
        start += t.numel()
    return out


@st.composite
def checkpoints(draw):
    dtype = draw(st.sampled_from(DTYPES))
    pool = pool_of(dtype)
    tensors = {}
    for name in ("a", "b"):
        rows, cols = draw(st.integers(1, 5)), draw(st.integers(1, 12))
        values = draw(st.lists(st.sampled_from(pool), min_size=rows * cols, max_size=rows * cols))
        tensors[name] = torch.tensor(values, dtype=torch.float64).to(dtype).reshape(rows, cols)
    amount = draw(st.sampled_from([0.0, 0.3, 0.5, 0.75, 0.9, 1.0]))
    how = draw(st.sampled_from(["sparsity", "fraction"])) if amount < 1 else "sparsity"
    scope = draw(st.sampled_from(["layer", "global"]))
    encoding = draw(st.sampled_from(["zeros", "mask", "nan"]))
    return tensors, (how, amount), scope, encoding


def keep_of(tensors: list[torch.Tensor], how: str, amount: float) -> int:
    """What prune keeps of these tensors pooled: --sparsity counts every weight, --fraction the
    non-zeros."""
    if how == "sparsity":
        total = sum(t.numel() for t in tensors)
        return total - round(amount * total)
    nonzero = sum(int((t.double() != 0).sum()) for t in tensors)
    return nonzero - round(amount * nonzero)


@settings(max_examples=150, deadline=None)
@given(checkpoints(), st.booleans())
def test_fast_path_equals_the_general_path_and_a_sort_reference(tmp_path_factory, case, chunked):
    tensors, (how, amount), scope, encoding = case
    tmp = tmp_path_factory.mktemp("fast")
    src = tmp / "in.safetensors"
    save_file(tensors, str(src))
    opts = PruneOptions(**{how: amount}, scope=scope, encoding=encoding, include=("a", "b"))
    with tiny_chunks(chunked):
        prune_checkpoint(src, tmp / "fast.safetensors", opts)
        with pytest.MonkeyPatch.context() as mp:
            general_path(mp)
            prune_checkpoint(src, tmp / "general.safetensors", opts)
    assert (tmp / "fast.safetensors").read_bytes() == (tmp / "general.safetensors").read_bytes()

    out = load_file(tmp / "fast.safetensors")
    names = ["a", "b"]
    if scope == "layer":
        expected = {
            n: reference([tensors[n]], keep_of([tensors[n]], how, amount))[0] for n in names
        }
    else:
        if tensors["a"].dtype == torch.float64:  # global scope ranks fp64 at fp32 precision
            return
        pooled = [tensors[n] for n in names]
        expected = dict(zip(names, reference(pooled, keep_of(pooled, how, amount))))
    for n in names:
        kept = expected[n]
        got = out[n]
        bits = got.view(
            {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
        )
        want = tensors[n].view(bits.dtype)
        assert torch.equal(bits[kept], want[kept]), n  # kept bits unchanged, -0.0 never kept
        if encoding == "nan":
            assert bool(torch.isnan(got[~kept].float()).all()), n
        else:
            assert bool((bits[~kept] == 0).all()), n  # pruned: +0.0
        if encoding == "mask":
            assert torch.equal(out[n + "_mask"], kept), n


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_inf_and_nan_are_refused_by_both_paths(tmp_path, monkeypatch, bad, dtype):
    w = torch.linspace(-1, 1, 40).to(dtype).reshape(4, 10)
    w[2, 3] = bad
    src = tmp_path / "in.safetensors"
    save_file({"w": w}, str(src))
    before = src.read_bytes()
    messages = []
    for general in (False, True):
        if general:
            general_path(monkeypatch)
        with pytest.raises(SparsetoolError) as e:
            prune_checkpoint(
                src, tmp_path / "out.safetensors", PruneOptions(sparsity=0.5, include=("w",))
            )
        messages.append(str(e.value))
    assert messages[0] == messages[1] and "'w'" in messages[0]
    assert src.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["in.safetensors"]


def _big_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    state = gpt2_like_state(n_layer=2, d=32, dtype=torch.bfloat16)
    # coarse values: many ties at every threshold
    state = {
        n: (torch.randint(-8, 9, t.shape, generator=g) / 4).to(t.dtype) if t.ndim == 2 else t
        for n, t in state.items()
    }
    return state


@pytest.mark.parametrize("scope", ["layer", "global"])
def test_any_number_of_workers_writes_the_same_bytes(tmp_path, scope):
    src = tmp_path / "in.safetensors"
    save_file(_big_state(), str(src))
    outs = []
    with tiny_chunks():
        for n in (1, 2, 3):
            workers.set_workers(n)
            out = tmp_path / f"w{n}.safetensors"
            prune_checkpoint(src, out, PruneOptions(sparsity=0.6, scope=scope))
            dense = tmp_path / f"d{n}.safetensors"
            densify_checkpoint(out, dense)
            outs.append((out.read_bytes(), dense.read_bytes(), summarize(out).to_json()))
    assert outs[0] == outs[1] == outs[2]


def test_cli_workers_option_gives_identical_files(tmp_path):
    src = tmp_path / "in.safetensors"
    save_file(_big_state(), str(src))
    files = []
    for n in ("1", "2"):
        out = tmp_path / f"out{n}.safetensors"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "sparsetool",
                "prune",
                str(src),
                "-o",
                str(out),
                "-s",
                "0.5",
                "--workers",
                n,
                "--quiet",
            ],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr
        files.append(out.read_bytes())
    assert files[0] == files[1]


def _imports_torch(*args: str) -> tuple[bool, subprocess.CompletedProcess]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "sparsetool", *args],
        capture_output=True,
        text=True,
    )
    loaded = any(re.search(r"\|\s+torch$", line.rstrip()) for line in proc.stderr.splitlines())
    return loaded, proc


def test_report_and_densify_of_plain_tensors_never_import_torch(tmp_path):
    src = tmp_path / "in.safetensors"
    save_file(_big_state(), str(src))
    pruned = tmp_path / "pruned.safetensors"
    prune_checkpoint(src, pruned, PruneOptions(sparsity=0.5))
    loaded, proc = _imports_torch("report", str(pruned), "--json")
    assert proc.returncode == 0 and not loaded
    assert json.loads(proc.stdout)["summary"]["targeted_sparsity"] == pytest.approx(0.5)
    loaded, proc = _imports_torch("densify", str(pruned), "-o", str(tmp_path / "dense.safetensors"))
    assert proc.returncode == 0 and not loaded
    # what needs decoding is decoded in numpy too: the mask encoding, to the same dense values
    masked = tmp_path / "masked.safetensors"
    prune_checkpoint(src, masked, PruneOptions(sparsity=0.5, encoding="mask"))
    loaded, proc = _imports_torch(
        "densify", str(masked), "-o", str(tmp_path / "dense2.safetensors")
    )
    assert proc.returncode == 0 and not loaded
    one, two = load_file(tmp_path / "dense.safetensors"), load_file(tmp_path / "dense2.safetensors")
    assert one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)


def _three_shards(root: Path, bad_in_second: bool) -> Path:
    d = root / "in"
    d.mkdir()
    state = gpt2_like_state(n_layer=3, d=16)
    if bad_in_second:
        state["transformer.h.1.mlp.c_fc.weight"][0, 0] = math.inf
    shards: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in state.items():
        layer = name.split(".")[2] if name.startswith("transformer.h.") else "0"
        shards.setdefault(f"model-0000{int(layer) + 1}-of-00003.safetensors", {})[name] = t
    for shard, tensors in shards.items():
        save_file(tensors, str(d / shard), metadata={"format": "pt"})
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {n: s for s, ts in shards.items() for n in ts}})
    )
    (d / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 3, "n_embd": 16}))
    return d


def test_a_failure_in_shard_two_leaves_no_output(tmp_path):
    src = _three_shards(tmp_path, bad_in_second=True)
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    with pytest.raises(SparsetoolError, match="infinite"):
        prune_checkpoint(src, tmp_path / "out", PruneOptions(sparsity=0.5))
    assert sorted(os.listdir(tmp_path)) == ["in"]  # no output, no temporary left
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before


def test_three_shards_prune_like_one_file(tmp_path):
    src = _three_shards(tmp_path, bad_in_second=False)
    out = tmp_path / "out"
    res = prune_checkpoint(src, out, PruneOptions(sparsity=0.5, scope="global"))
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in src.iterdir())
    merged = {n: t for p in sorted(out.glob("*.safetensors")) for n, t in load_file(p).items()}
    original = {n: t for p in sorted(src.glob("*.safetensors")) for n, t in load_file(p).items()}
    targeted = [t.name for t in res.tensors]
    total = sum(original[n].numel() for n in targeted)
    assert sum(int((merged[n] == 0).sum()) for n in targeted) == round(0.5 * total)
    for n, t in original.items():
        if n not in targeted:
            assert torch.equal(merged[n], t)


def test_imap_yields_in_order_and_keeps_at_most_a_few_ahead():
    import threading
    import time

    started: list[int] = []
    lock = threading.Lock()

    def slow_square(x: int) -> int:
        with lock:
            started.append(x)
        time.sleep(0.01 * (x % 3))  # finishing out of order
        return x * x

    workers.set_workers(2)
    assert list(workers.imap(slow_square, range(20), ahead=2)) == [x * x for x in range(20)]
    started.clear()
    gen = workers.imap(slow_square, range(100), ahead=2)
    assert [next(gen) for _ in range(3)] == [0, 1, 4]
    gen.close()  # the caller stops: what was not started never is
    time.sleep(0.1)
    assert len(started) <= 3 + 3
    workers.set_workers(1)
    assert list(workers.imap(slow_square, range(5))) == [0, 1, 4, 9, 16]


def test_imap_waits_for_running_items_when_the_caller_stops():
    """A caller that stops (an error, Ctrl-C) may then close and remove the file the items
    write to: nothing of the items may still be running by then."""
    import threading
    import time

    running = threading.Event()
    finished: list[int] = []

    def slow(x: int) -> int:
        if x == 1:
            running.set()
            time.sleep(0.3)
            finished.append(x)
        return x

    workers.set_workers(2)
    try:
        gen = workers.imap(slow, range(10), ahead=1)
        assert next(gen) == 0
        assert running.wait(5)
        gen.close()
        assert finished == [1]  # item 1 was running: close() returned only after it ended
    finally:
        workers.set_workers(None)


@pytest.mark.parametrize("misleading", [False, True])
def test_global_scope_finds_the_exact_threshold_whatever_the_samples_say(
    tmp_path, monkeypatch, misleading
):
    """Global scope counts each plain tensor's buckets one by one only around where samples (one
    block of 4096 weights in 64) put the threshold. When the samples mislead (the sampled blocks
    hold the large weights, the rest is small), every bucket is counted after all: the masks are
    those of the exact global selection either way."""
    g = torch.Generator().manual_seed(5)
    state = gpt2_like_state(n_layer=1, d=16)
    n = 2 * 64 * 4096  # two sample strides: blocks [0, 4096) and [262144, 266240) are sampled
    big = torch.rand(n, generator=g) * 1e-3 + 1e-4
    if misleading:
        for start in (0, 64 * 4096):
            big[start : start + 4096] = 1.0 + torch.rand(4096, generator=g)
    state["transformer.h.0.mlp.c_fc.weight"] = big.reshape(512, 1024)
    src, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    save_file({k: v.to(torch.bfloat16) for k, v in state.items()}, str(src))
    histogram = prune_module.MagnitudeHistogram
    original, lows = histogram.of_scan, []

    def recording(cls, found, dtype, *, low=None, high=None):
        lows.append(low)
        return original(found, dtype, low=low, high=high)

    monkeypatch.setattr(histogram, "of_scan", classmethod(recording))
    prune_checkpoint(src, out, PruneOptions(sparsity=0.5, scope="global"))
    assert any(lows) and (0 in lows) == misleading  # the partial histograms, then every bucket
    from sparsetool.masks.global_magnitude import global_magnitude_masks

    names = [k for k in state if k.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))]
    dense = load_file(str(src))
    want = global_magnitude_masks([dense[k] for k in names], 0.5)
    got = load_file(str(out))
    for name, mask in zip(names, want):
        assert torch.equal(got[name] != 0, mask & (dense[name] != 0)), name


@pytest.mark.parametrize("sparsity,seed", [(0.01, 0), (0.01, 1), (0.005, 2), (0.02, 3), (0.98, 0)])
def test_global_scope_near_nothing_or_everything_pruned_on_sampled_tensors(
    tmp_path, sparsity, seed
):
    """Tensors of more than 262,144 weights are sampled (their estimated counts are not whole
    numbers, and their sum and running sum round differently); asking to keep nearly all or
    nearly none of the weights still finds the exact threshold."""
    g = torch.Generator().manual_seed(seed)
    state = {k: v for k, v in gpt2_like_state(n_layer=2, d=16).items()}
    for i in range(2):
        state[f"transformer.h.{i}.mlp.c_fc.weight"] = (
            torch.randn(700, 1000, generator=g) * 0.02 * (i + 1)
        ).bfloat16()
        state[f"transformer.h.{i}.attn.c_proj.weight"] = torch.randn(300, 300, generator=g) * 0.05
    src, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    save_file(state, str(src))
    prune_checkpoint(src, out, PruneOptions(sparsity=sparsity, scope="global"))
    from sparsetool.masks.global_magnitude import global_magnitude_masks

    names = [k for k in state if k.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))]
    dense = load_file(str(src))
    want = global_magnitude_masks([dense[k] for k in names], sparsity)
    got = load_file(str(out))
    for name, mask in zip(names, want):
        assert torch.equal(got[name] != 0, mask & (dense[name] != 0)), name
