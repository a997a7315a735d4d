"""prune (magnitude and random, layer and global scope, N:M, --fraction, every encoding, encoded
inputs), densify and report never import torch: its start-up alone would cost as much as
copying a 2.6 GB file.

Each case runs the real command line in one fresh interpreter, which then reports whether
``torch`` was ever imported (``sys.modules`` keeps every module imported since start-up).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from helpers import ROOT, gpt2_like_state

RUNNER = r"""
import json, sys
from sparsetool.cli.main import main
codes = []
for argv in json.loads(sys.argv[1]):
    sys.argv = ["sparsetool", *argv]
    try:
        main()
        codes.append(0)
    except SystemExit as e:
        codes.append(e.code if isinstance(e.code, int) else 1)
print(json.dumps({"codes": codes, "torch": "torch" in sys.modules}))
"""


def _run_all(cases: list[list[str]]) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, json.dumps(cases)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_checkpoint_commands_never_import_torch(tmp_path: Path):
    files = {}
    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn):
        state = gpt2_like_state(d=16, dtype=torch.float32)
        state = {k: v.to(dtype) for k, v in state.items()}
        files[dtype] = tmp_path / f"{str(dtype).removeprefix('torch.')}.safetensors"
        save_file(state, str(files[dtype]), metadata={"format": "pt"})
    bf16 = files[torch.bfloat16]
    out = tmp_path / "out"
    out.mkdir()
    cases = [
        ["prune", "--help"],
        ["prune", str(bf16), "-o", str(out / "bad.safetensors")],
    ]  # usage: exit 2
    for dtype, path in files.items():
        name = str(dtype).removeprefix("torch.")
        for encoding in ("zeros", "mask", "nan", "bitmask"):
            cases.append(
                [
                    "prune",
                    str(path),
                    "-o",
                    str(out / f"{name}-{encoding}.safetensors"),
                    "--sparsity",
                    "0.75",
                    "--encoding",
                    encoding,
                    "-q",
                ]
            )
    o = str(out)
    cases += [
        [
            "prune",
            str(bf16),
            "-o",
            f"{o}/global.safetensors",
            "--sparsity",
            "0.6",
            "--scope",
            "global",
            "-q",
        ],
        [
            "prune",
            str(files[torch.float32]),
            "-o",
            f"{o}/global32.safetensors",
            "--sparsity",
            "0.6",
            "--scope",
            "global",
            "--encoding",
            "bitmask",
            "-q",
        ],
        ["prune", str(bf16), "-o", f"{o}/nm.safetensors", "--nm", "2:4", "-q"],
        ["prune", str(bf16), "-o", f"{o}/fraction.safetensors", "--fraction", "0.5", "-q"],
        [
            "prune",
            str(bf16),
            "-o",
            f"{o}/random.safetensors",
            "--sparsity",
            "0.5",
            "--method",
            "random",
            "-q",
        ],
        [
            "prune",
            str(bf16),
            "-o",
            f"{o}/erk.safetensors",
            "--sparsity",
            "0.7",
            "--distribution",
            "erk",
            "--json",
        ],
    ]
    for encoding in ("mask", "nan", "bitmask"):  # an encoded input pruned again
        cases.append(
            [
                "prune",
                f"{o}/bfloat16-{encoding}.safetensors",
                "-o",
                f"{o}/again-{encoding}.safetensors",
                "--fraction",
                "0.5",
                "--encoding",
                encoding,
                "-q",
            ]
        )
    cases.append(
        [
            "prune",
            f"{o}/bfloat16-bitmask.safetensors",
            "-o",
            f"{o}/again-global.safetensors",
            "--fraction",
            "0.3",
            "--scope",
            "global",
            "-q",
        ]
    )
    for name in (
        "float8_e4m3fn-nan",
        "bfloat16-mask",
        "bfloat16-bitmask",
        "float16-nan",
    ):  # and back
        cases.append(
            ["densify", f"{o}/{name}.safetensors", "-o", f"{o}/dense-{name}.safetensors", "-q"]
        )
        cases.append(["report", f"{o}/{name}.safetensors", "--json"])
    found = _run_all(cases)
    assert found["codes"][:2] == [0, 2]
    assert found["codes"][2:] == [0] * (len(cases) - 2), list(zip(found["codes"], cases))
    assert found["torch"] is False
    assert (out / "again-bitmask.safetensors").exists()


def test_calibration_prune_still_loads_torch(tmp_path: Path):
    """The check above can fail: a command that needs torch shows up in ``sys.modules``."""
    path = tmp_path / "m.safetensors"
    save_file(gpt2_like_state(d=16), str(path), metadata={"format": "pt"})
    found = _run_all([["diff", str(path), str(path), "-q"]])
    assert found["torch"] is True
