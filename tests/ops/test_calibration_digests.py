"""Calibration pruning's pruned tensors, pinned: the SHA-256 of every targeted tensor prune writes
with ``--method wanda|sparsegpt`` (50% and 2:4) on the tiny GPT-2 and Llama of the tests, in
``calibration_digests.json``.

A change of how the statistics are gathered, held or freed (one ``X^T X`` per distinct input of a
block, the inverse Hessian computed in place) must leave every tensor bit for bit as it was; the
digests were made by the code before such changes. The tensors come out of float32 matrix
products, whose rounding depends on torch's build and its number of threads: they are pinned for
one torch build (recorded in the file; another torch skips the test, and a regeneration there needs
the code of a commit whose output is known to be right) on one thread.

Regenerate with ``python tests/ops/test_calibration_digests.py --regenerate`` ONLY when a change of
the pruned values is intended, and say in the commit which variants changed and why.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch

DIGESTS = Path(__file__).with_name("calibration_digests.json")
VARIANTS = {
    f"{model}/{method}-{how}": (model, method, how)
    for model in ("gpt2", "llama")
    for method in ("wanda", "sparsegpt")
    for how in ("s0.5", "nm2:4")
}


def digests_of(model: str, method: str, how: str, work: Path) -> dict[str, str]:
    """Prune the tiny ``model`` (made as the tests' ``model_dir`` fixture makes it) and hash each
    targeted tensor's dtype, shape and bytes."""
    from safetensors import safe_open

    from sparsetool.ops.prune import PruneOptions, prune_checkpoint

    from helpers import CALIB, hf_model, make_text, save_tokenizer

    text = make_text(400)
    src, calib, out = work / f"{model}-dense", work / "calib.txt", work / f"{model}-{method}-{how}"
    if not src.exists():
        torch.manual_seed(0)
        hf_model(model).eval().save_pretrained(src)
        save_tokenizer(src, text)
    calib.write_text(text)
    amount = dict(sparsity=0.5) if how == "s0.5" else dict(nm=(2, 4))
    result = prune_checkpoint(
        src, out, PruneOptions(method=method, calibration=str(calib), **amount, **CALIB)
    )
    names = {t.name for t in result.tensors}
    table = {}
    for f in sorted(out.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for name in st.keys():
                if name in names:
                    t = st.get_tensor(name).contiguous()
                    h = hashlib.sha256(f"{t.dtype} {list(t.shape)}".encode())
                    h.update(t.view(torch.uint8).numpy().tobytes())
                    table[name] = h.hexdigest()
    assert sorted(table) == sorted(names)
    return table


@pytest.fixture(scope="module")
def pinned() -> dict:
    table = json.loads(DIGESTS.read_text())
    if table["torch"] != torch.__version__:
        pytest.skip(f"digests made with torch {table['torch']}, this is {torch.__version__}")
    return table


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_calibration_pruning_writes_the_pinned_tensors(variant, pinned, tmp_path_factory):
    work = tmp_path_factory.getbasetemp() / "calibration-digests"
    work.mkdir(exist_ok=True)
    got = digests_of(*VARIANTS[variant], work)
    want = pinned["variants"][variant]
    assert sorted(got) == sorted(want)
    moved = [name for name in want if got[name] != want[name]]
    assert not moved, f"{variant}: these tensors changed: {moved}"


def regenerate() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for helpers
    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        table = {v: digests_of(*VARIANTS[v], Path(tmp)) for v in sorted(VARIANTS)}
    DIGESTS.write_text(
        json.dumps({"torch": torch.__version__, "variants": table}, indent=1, sort_keys=True) + "\n"
    )
    print(f"wrote {len(table)} variants to {DIGESTS}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--regenerate"]:
        sys.exit(
            f"usage: python {sys.argv[0]} --regenerate  (only for an intended change of values)"
        )
    regenerate()
