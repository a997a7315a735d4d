"""Calibration pruning's output (``prune --method wanda|sparsegpt``, 50% and 2:4, on the tiny GPT-2
and Llama of the tests), checked two ways that hold on any CPU.

1. Against an independent float64 reference (``tests/calibration_reference.py``: transformers in
   float64, both methods written out with numpy), on this machine's own code path. Exact, whatever
   the CPU: which tensors are pruned, every count (each row's share for Wanda, each column block's
   for SparseGPT, N of every M), and Wanda's kept weights are the input's own bytes. Within a
   tolerance: the masks (at most 0.5% of a tensor's positions may differ, where float32 and float64
   order two nearly equal scores differently; none differ on the AVX-512, AVX2 and plain x86-64
   paths) and SparseGPT's updated weights (relative error at most 1e-4 on the rows whose mask
   agrees; 3-4e-6 measured on those three paths).

2. Bit for bit, the SHA-256 of every targeted tensor in ``calibration_digests.json``, on one code
   path every x86-64 CPU has: the prune runs in a child process with ATen's plain kernels
   (``ATEN_CPU_CAPABILITY=default``), MKL's conditional numerical reproducibility branch
   ``MKL_CBWR=COMPATIBLE`` and oneDNN at SSE4.1, on one thread. Float32 products round differently
   on AVX-512, AVX2 and SSE (MKL and ATen choose their kernels by the CPU), so the bytes of a
   default run differ from CPU to CPU; this path makes them the same everywhere, and a change of
   how statistics are gathered, held or freed must leave them bit for bit as they were. The digests
   are pinned for one torch build (recorded in the file; another torch, or a CPU without MKL such
   as an ARM one, skips this part and keeps part 1).

Regenerate with ``python tests/ops/prune/test_calibration_digests.py --regenerate`` ONLY when a
change of the pruned values is intended, and say in the commit which variants changed and why.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

DIGESTS = Path(__file__).with_name("calibration_digests.json")
VARIANTS = {
    f"{model}/{method}-{how}": (model, method, how)
    for model in ("gpt2", "llama")
    for method in ("wanda", "sparsegpt")
    for how in ("s0.5", "nm2:4")
}
# One code path on every x86-64 CPU (see the module's docstring); threads pinned to one as well.
PORTABLE = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "COMPATIBLE",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
PATH_NAME = "x86-64 portable: ATen default, MKL_CBWR=COMPATIBLE, oneDNN SSE4.1, one thread"
MASK_DIFFER = 0.005  # of a tensor's positions
VALUE_RTOL = 1e-4


def prune_variant(model: str, method: str, how: str, work: Path) -> tuple[Path, str, Path, set]:
    """Prune the tiny ``model`` (made as the tests' ``model_dir`` fixture makes it): (its
    directory, the calibration text, the output, the targeted tensors' names)."""
    from sparsetool.ops.prune import PruneOptions, prune_checkpoint

    from helpers import CALIB, hf_model, make_text, save_tokenizer

    text = make_text(400)
    src, calib, out = work / f"{model}-dense", work / "calib.txt", work / f"{model}-{method}-{how}"
    if not src.exists():
        torch.manual_seed(0)
        hf_model(model).eval().save_pretrained(src)
        save_tokenizer(src, text)
    calib.write_text(text)
    result = prune_checkpoint(
        src, out, PruneOptions(method=method, calibration=str(calib), **amount(how), **CALIB)
    )
    return src, text, out, {t.name for t in result.tensors}


def read_targets(out: Path, names: set) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    table = {}
    for f in sorted(out.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for name in st.keys():
                if name in names:
                    table[name] = st.get_tensor(name).contiguous()
    assert sorted(table) == sorted(names)
    return table


def digests_of(model: str, method: str, how: str, work: Path) -> dict[str, str]:
    """Prune the tiny ``model`` and hash each targeted tensor's dtype, shape and bytes."""
    _src, _text, out, names = prune_variant(model, method, how, work)
    table = {}
    for name, t in read_targets(out, names).items():
        h = hashlib.sha256(f"{t.dtype} {list(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
        table[name] = h.hexdigest()
    return table


def amount(how: str) -> dict:
    return dict(sparsity=0.5) if how == "s0.5" else dict(nm=(2, 4))


# ------------------------------------------------------------------ 1. the float64 reference
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_calibration_pruning_matches_a_float64_reference(variant, tmp_path):
    from safetensors.torch import load_file

    from calibration_reference import reference_prune
    from helpers import CALIB

    model, method, how = VARIANTS[variant]
    src, text, out, names = prune_variant(model, method, how, tmp_path)
    got = read_targets(out, names)
    ref = reference_prune(src, text, method, **amount(how), **CALIB)
    assert sorted(got) == sorted(ref)
    source = load_file(str(src / "model.safetensors"))
    conv = model == "gpt2"  # GPT-2's Conv1D stores (in, out): rows are inputs
    for name in sorted(got):
        g = got[name].double().numpy()
        r = ref[name]
        g_out, r_out = (g.T, r.T) if conv else (g, r)  # (out, in)
        kept = g_out != 0
        # exact: the counts
        if how == "nm2:4":
            assert (kept.reshape(kept.shape[0], -1, 4).sum(-1) == 2).all(), name
        elif method == "wanda":
            assert sorted(set(kept.sum(1).tolist())) == [kept.shape[1] // 2], name
        else:
            for i1 in range(0, kept.shape[1], 128):  # each block its share: half, as it is 1/2
                assert kept[:, i1 : i1 + 128].sum() * 2 == kept[:, i1 : i1 + 128].size, name
        # exact: Wanda keeps the input's own bits
        if method == "wanda":
            w = source[name].numpy()
            assert np.array_equal(
                got[name].numpy()[g != 0].view(np.uint32), w[g != 0].view(np.uint32)
            ), name
        # within tolerance: masks, and the values of rows whose masks agree
        differ = kept != (r_out != 0)
        assert differ.mean() <= MASK_DIFFER, f"{name}: {differ.sum()} of {differ.size} differ"
        rows = ~differ.any(1)
        err = np.linalg.norm(g_out[rows] - r_out[rows]) / np.linalg.norm(r_out[rows])
        assert err <= VALUE_RTOL, f"{name}: relative error {err:.2e} against float64"


# ------------------------------------------------------------------ 2. bytes on one code path
@pytest.fixture(scope="module")
def pinned() -> dict:
    if (
        platform.machine().lower() not in ("x86_64", "amd64")
        or not torch.backends.mkl.is_available()
    ):
        pytest.skip(f"the pinned path is x86-64 with MKL; this is {platform.machine()}")
    table = json.loads(DIGESTS.read_text())
    if table["torch"] != torch.__version__:
        pytest.skip(f"digests made with torch {table['torch']}, this is {torch.__version__}")
    assert table["path"] == PATH_NAME
    return table


@pytest.fixture(scope="module")
def portable(pinned, tmp_path_factory) -> dict:
    """Every variant's digests, from a child process on the portable path."""
    return portable_digests(tmp_path_factory.mktemp("calibration-digests"))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_calibration_pruning_writes_the_pinned_tensors(variant, pinned, portable):
    got = portable[variant]
    want = pinned["variants"][variant]
    assert sorted(got) == sorted(want)
    moved = [name for name in want if got[name] != want[name]]
    assert not moved, f"{variant}: these tensors changed: {moved}"


def portable_digests(work: Path) -> dict:
    """Run this file as ``--print WORK`` in a child process with :data:`PORTABLE` set."""
    env = os.environ | PORTABLE | {"HF_HUB_OFFLINE": "1"}
    run = subprocess.run(
        [sys.executable, __file__, "--print", str(work)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


def _print(work: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # for helpers
    torch.set_num_threads(1)
    table = {v: digests_of(*VARIANTS[v], work) for v in sorted(VARIANTS)}
    print(json.dumps(table, sort_keys=True))


def regenerate() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        table = portable_digests(Path(tmp))
    record = {"torch": torch.__version__, "path": PATH_NAME, "variants": table}
    DIGESTS.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(table)} variants to {DIGESTS}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--print"] and len(sys.argv) == 3:
        _print(Path(sys.argv[2]))
    elif sys.argv[1:] == ["--regenerate"]:
        regenerate()
    else:
        sys.exit(
            f"usage: python {sys.argv[0]} --regenerate  (only for an intended change of values)"
        )
