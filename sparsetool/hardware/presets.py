"""Built-in hardware presets, each number with its source, and ``--hardware FILE`` overrides.

Every constant is either a published figure (the source is named beside it) or a parameter fitted
to a published measurement (``fitted:`` says to what; :mod:`sparsetool.hardware.fits` recomputes
it and the tests check the two agree) or a stated modelling assumption (``assumed:``).
"""

from __future__ import annotations

import math
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

from sparsetool.errors import ConfigError
from sparsetool.hardware.devices import (
    CPU,
    KINDS,
    Dataflow,
    DenseGPU,
    Device,
    FlashLLMGPU,
    Sparse24GPU,
    SpMMGPU,
)
from sparsetool.util.configfile import SUFFIXES, load_mapping

_CS2 = "Cerebras CS-2 (Lie, Hot Chips 34, 2022; CS-2 datasheet)"
_A100 = "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020), A100 80GB SXM"
_H100 = "NVIDIA H100 Tensor Core GPU datasheet (2022), H100 SXM"
_PT24 = (
    "PyTorch blog, 'Accelerating Neural Network Training with Semi-Structured (2:4) Sparsity' "
    "(2024): 13008x4096x1024 GEMM on A100, 538 us dense, 387 us 2:4"
)
_FLASH = (
    "Flash-LLM (Xia et al., 'Flash-LLM: Enabling Cost-Effective and Highly-Efficient Large "
    "Generative Model Inference with Unstructured Sparsity', VLDB 2024): ~1.4x / 1.7x / 2.1x "
    "over cuBLAS at 70 / 80 / 90% sparsity, skinny (few-token) matmuls"
)

_GPU_COMMON = {
    "eta": (
        0.656,
        f"fitted: dense tensor-core efficiency so the modelled dense GEMM takes 538 us ({_PT24})",
    ),
    "eta_mem": (0.8, "assumed: fraction of peak memory bandwidth a large GEMM streams at"),
    "launch_s": (5e-6, "assumed: per-kernel launch and tail overhead, 5 us"),
    "value_bytes": (2.0, "FP16/BF16 operands, 2 bytes"),
}
_A100_BASE = {
    "peak_flops": (312e12, f"{_A100}: 312 TFLOP/s dense FP16/BF16 tensor core"),
    "bandwidth": (2.039e12, f"{_A100}: 2,039 GB/s HBM2e (40GB PCIe part: 1,555 GB/s)"),
    **_GPU_COMMON,
}
_H100_BASE = {
    "peak_flops": (989e12, f"{_H100}: 989 TFLOP/s dense FP16/BF16 tensor core"),
    "bandwidth": (3.35e12, f"{_H100}: 3.35 TB/s HBM3"),
    **_GPU_COMMON,
    "eta": (
        0.656,
        "assumed: same tensor-core efficiency as fitted on A100 (no H100 figure in the sources)",
    ),
}
_24 = {
    "math_speedup": (
        1.395,
        f"fitted: 2:4 math speedup so the modelled sparse GEMM takes 387 us ({_PT24}); "
        "hardware limit 2.0",
    ),
    "metadata_bytes": (0.25, f"{_A100}: 2-bit position index per kept value of a 2:4 group"),
}

PRESETS: dict[str, tuple[type[Device], dict[str, tuple[Any, str]]]] = {
    "cs2": (
        Dataflow,
        {
            "cores": (850_000, f"{_CS2}: 850,000 AI-optimised cores"),
            "clock_hz": (1.1e9, f"{_CS2}: ~1.1 GHz"),
            "fmac_per_core_cycle": (
                4.0,
                f"{_CS2}: 4 FP16 FMAC per core per cycle "
                "(850k x 4 x 2 x 1.1 GHz = 7.5 PFLOP/s peak)",
            ),
            "sram_bandwidth": (20e15, f"{_CS2}: 40 GB on-chip SRAM at 20 PB/s"),
            "sram_bytes": (40e9, f"{_CS2}: 40 GB on-chip SRAM"),
            "fabric_bandwidth": (27.5e15, f"{_CS2}: 220 Pb/s (27.5 PB/s) on-wafer fabric"),
            "groups_m": (
                32,
                "assumed: the grid the work is balanced over, 32 x 32 core groups "
                "(no published figure; finer grids show more imbalance)",
            ),
            "groups_k": (32, "assumed: see groups_m"),
            "fixed_s": (
                1.28e-6,
                "fitted: per-layer per-pass overhead so the modelled 12k x 12k GPT-3 matmul "
                "(2048 tokens, random mask) reaches 85% of theoretical (8.5x) at 90% sparsity; "
                "SPDF paper Appendix C (after Lie 2021) plots measured close to theoretical "
                "there but gives no table, so 85% is an assumed reading",
            ),
            "weight_streaming": (
                False,
                "assumed: weights resident in on-chip SRAM, as for one layer's "
                "matmul; set true to stream them in (weight-streaming mode)",
            ),
            "stream_bandwidth": (
                150e9,
                f"{_CS2}: 1.2 Tb/s of 100 GbE I/O feeding weights from external "
                "memory (weight streaming)",
            ),
            "weight_bytes": (2.0, "FP16 weights, 2 bytes"),
            "index_bytes": (2.0, "assumed: a 16-bit position travels with each non-zero weight"),
            "partial_sum_bytes": (4.0, "assumed: FP32 partial sums reduced over the fabric"),
            "dense_fallback": (
                True,
                "assumed: the compiler runs a layer with the dense kernel where that is "
                "faster (set false to force the sparse kernel everywhere)",
            ),
        },
    ),
    "a100": (DenseGPU, dict(_A100_BASE)),
    "h100": (DenseGPU, dict(_H100_BASE)),
    "a100-2:4": (Sparse24GPU, {**_A100_BASE, **_24}),
    "h100-2:4": (
        Sparse24GPU,
        {
            **_H100_BASE,
            **_24,
            "math_speedup": (1.395, "assumed: same measured 2:4 gain as on A100"),
        },
    ),
    "a100-sputnik": (
        SpMMGPU,
        {
            **_A100_BASE,
            "break_even_sparsity": (
                0.90,
                "Gale et al., 'Sparse GPU Kernels for Deep Learning' (Sputnik, "
                "SC 2020): unstructured SpMM breaks even with cuBLAS near 90% sparsity",
            ),
            "index_bytes": (4.0, "CSR with 32-bit column indices"),
        },
    ),
    "a100-cusparse": (
        SpMMGPU,
        {
            **_A100_BASE,
            "break_even_sparsity": (
                0.98,
                "cuSPARSE SpMM breaks even with cuBLAS near 98% sparsity "
                "(as reported by Gale et al., SC 2020)",
            ),
            "index_bytes": (4.0, "CSR with 32-bit column indices"),
        },
    ),
    "a100-flash-llm": (
        FlashLLMGPU,
        {
            **_A100_BASE,
            "floor": (
                0.355,
                f"fitted: weight traffic = floor + slope x density (of dense), least squares on "
                f"1/speedup against density, to {_FLASH}",
            ),
            "slope": (1.19, "fitted: see floor"),
        },
    ),
    "cpu": (
        CPU,
        {
            "dense_flops": (
                120e9,
                "assumed: a generic 2-core AVX2/AVX-512 server CPU: 2 cores x 2.5 GHz x 32 "
                "FP32 FLOP/cycle (two 256-bit FMA units, or one 512-bit) = 160 GFLOP/s peak, "
                "of which a BLAS SGEMM reaches about 75%",
            ),
            "bandwidth": (
                15e9,
                "assumed: the DRAM bandwidth two cores of a server draw (about 7.5 GB/s each, "
                "bound by the requests a core keeps in flight; the socket's total is far higher)",
            ),
            "launch_s": (
                5e-6,
                "assumed: per-call overhead of a dense matmul called from Python (dispatch, "
                "output allocation), 5 us",
            ),
            "sparse_mac_rate": (
                2.5e9,
                "assumed: a CSR kernel does about one multiply-add per cycle on one "
                "2.5 GHz core (an index load and an indirect activation load per "
                "non-zero, little SIMD; scipy's CSR product runs on one thread)",
            ),
            "sparse_bandwidth": (
                8e9,
                "assumed: about one core's streaming bandwidth (half of bandwidth): the "
                "CSR kernel's indirect loads keep fewer requests in flight",
            ),
            "sparse_launch_s": (
                5e-6,
                "assumed: as launch_s, a compiled kernel called from Python; a "
                "library's format checks can cost more, which a fit to a measurement "
                "(simulate --measured --fit) finds",
            ),
            "value_bytes": (
                4.0,
                "FP32 weights and activations, 4 bytes (--measured uses the measurement's dtype)",
            ),
            "index_bytes": (
                4.0,
                "CSR with 32-bit column indices and row pointers (scipy's, below 2**31 "
                "non-zeros; --measured uses 8 for torch's 64-bit CSR)",
            ),
        },
    ),
}

# The unit of each constant, for --list-hardware (None: a plain number, count or switch).
UNITS: dict[str, str | None] = {
    "cores": None,
    "clock_hz": "Hz",
    "fmac_per_core_cycle": "FMAC/cycle",
    "sram_bandwidth": "B/s",
    "sram_bytes": "B",
    "fabric_bandwidth": "B/s",
    "groups_m": None,
    "groups_k": None,
    "fixed_s": "s",
    "weight_streaming": None,
    "stream_bandwidth": "B/s",
    "weight_bytes": "B",
    "index_bytes": "B",
    "partial_sum_bytes": "B",
    "dense_fallback": None,
    "peak_flops": "FLOP/s",
    "bandwidth": "B/s",
    "eta": None,
    "eta_mem": None,
    "launch_s": "s",
    "value_bytes": "B",
    "math_speedup": "x",
    "metadata_bytes": "B",
    "break_even_sparsity": None,
    "floor": None,
    "slope": None,
    "dense_flops": "FLOP/s",
    "sparse_mac_rate": "MAC/s",
    "sparse_bandwidth": "B/s",
    "sparse_launch_s": "s",
}
CITATIONS = (_CS2, _A100, _H100, _PT24, _FLASH)
"""The publications the constants cite, each named once per device by :func:`cite_once`."""


def cite_once(sources: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """Each source with the publications of :data:`CITATIONS` replaced by ``[n]``, and the
    publications in the order first cited: ``({"cores": "850,000 AI-optimised cores [1]"},
    ["Cerebras CS-2 (...)"])``."""
    cited: list[str] = []
    out = {}
    for key, src in sources.items():
        for cite in CITATIONS:
            if cite not in src:
                continue
            if cite not in cited:
                cited.append(cite)
            ref = f"[{cited.index(cite) + 1}]"
            if src.startswith(cite + ": "):
                src = f"{src[len(cite) + 2 :]} {ref}"
            else:
                src = src.replace(f"({cite})", ref).replace(cite, ref)
        out[key] = src
    return out, cited


# Valid ranges: (low, high, low inclusive). Fields not listed must be finite and > 0.
_RANGES = {
    "eta": (0.0, 1.0, False),
    "eta_mem": (0.0, 1.0, False),
    "break_even_sparsity": (0.0, 1.0, True),
    "math_speedup": (1.0, 2.0, True),
    "fixed_s": (0.0, math.inf, True),
    "launch_s": (0.0, math.inf, True),
    "sparse_launch_s": (0.0, math.inf, True),
    "index_bytes": (0.0, math.inf, True),
    "metadata_bytes": (0.0, math.inf, True),
    "floor": (0.0, math.inf, True),
}


def _build(name: str, cls: type[Device], values: dict[str, Any], where: str) -> Device:
    known = {f.name: f for f in fields(cls) if f.name != "name"}
    kw = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(
                f"{where}: '{name}' ({cls.kind}) has no setting '{key}'; "
                f"known: {', '.join(sorted(known))}"
            )
        kw[key] = _check(name, key, value, known[key].type, where)
    if isinstance(kw.get("break_even_sparsity"), float) and kw["break_even_sparsity"] >= 1.0:
        raise ConfigError(f"{where}: '{name}'.break_even_sparsity must be below 1")
    device = cls(name=name, **kw)
    if isinstance(device, Dataflow) and device.groups_m * device.groups_k > device.cores:
        raise ConfigError(
            f"{where}: '{name}' has {device.groups_m} x {device.groups_k} = "
            f"{device.groups_m * device.groups_k:,} core groups but only {device.cores:,} cores; "
            "each group needs at least one core: lower groups_m/groups_k or raise cores"
        )
    return device


def _check(name: str, key: str, value: Any, typ: Any, where: str) -> Any:
    typ = str(typ)
    if "bool" in typ:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: '{name}'.{key} must be true or false, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{where}: '{name}'.{key} must be a number, got {value!r}")
    if "int" in typ:
        if value != int(value) or value < 1:
            raise ConfigError(
                f"{where}: '{name}'.{key} must be a positive whole number, got {value!r}"
            )
        return int(value)
    lo, hi, lo_incl = _RANGES.get(key, (0.0, math.inf, False))
    if not ((value >= lo if lo_incl else value > lo) and value <= hi):
        bound = f"{'at least' if lo_incl else 'above'} {lo}" + (
            f" and at most {hi}" if hi < math.inf else ""
        )
        raise ConfigError(f"{where}: '{name}'.{key} must be {bound}, got {value!r}")
    return float(value)


def builtin_devices() -> dict[str, Device]:
    """Every preset, built."""
    return {
        name: _build(name, cls, {k: v for k, (v, _) in table.items()}, "preset")
        for name, (cls, table) in PRESETS.items()
    }


def sources(name: str) -> dict[str, str]:
    """Where each constant of preset ``name`` comes from."""
    return {k: src for k, (_, src) in PRESETS[name][1].items()}


def read_hardware_file(path: Path) -> dict[str, Any]:
    """Parse a TOML, YAML or JSON hardware file into ``{device name: {setting: value}}``."""
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise ConfigError(f"hardware file '{path}': use a .toml, .yaml/.yml or .json suffix")
    data = load_mapping(path, what="hardware file")
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ConfigError(
            f"hardware file '{path}': expected tables of settings keyed by device name, "
            "e.g. [cs2] fixed_s = 2e-6"
        )
    return data


def load_devices(path: Path | None = None) -> tuple[dict[str, Device], dict[str, dict[str, str]]]:
    """The presets with ``path``'s overrides applied, and every constant's source.

    A table named like a preset changes only the settings it gives. A new name needs
    ``base = "<preset>"`` (start from that preset) or ``kind = "<kind>"`` (start from the kind's
    defaults; kinds: dataflow, gpu-dense, gpu-2:4, gpu-spmm, gpu-flash-llm, cpu). A sub-table
    ``[NAME.sources]`` may say where settings given in the table come from (as
    :func:`write_hardware_file` does for fitted constants); otherwise their source is the file.
    """
    devices = builtin_devices()
    srcs = {name: sources(name) for name in devices}
    if path is None:
        return devices, srcs
    where = f"hardware file '{path}'"
    for name, table in read_hardware_file(path).items():
        table = dict(table)
        base, kind = table.pop("base", None), table.pop("kind", None)
        given = _given_sources(table.pop("sources", {}), table, name, where)
        if name in devices and base is None and kind is None:
            cls, start, src = type(devices[name]), _values(devices[name]), dict(srcs[name])
        elif base is not None:
            if base not in devices:
                raise ConfigError(
                    f"{where}: '{name}' has base '{base}', which is not a preset; "
                    f"presets: {', '.join(PRESETS)}"
                )
            cls, start, src = type(devices[base]), _values(devices[base]), dict(srcs[base])
        elif kind is not None:
            if kind not in KINDS:
                raise ConfigError(
                    f"{where}: '{name}' has unknown kind '{kind}'; kinds: {', '.join(KINDS)}"
                )
            cls, start, src = KINDS[kind], {}, {}
        else:
            raise ConfigError(
                f"{where}: '{name}' is not a preset; give base = \"<preset>\" or "
                f'kind = "<kind>" (presets: {", ".join(PRESETS)})'
            )
        devices[name] = _build(name, cls, {**start, **table}, where)
        srcs[name] = {**src, **{k: given.get(k, f"set in {path}") for k in table}}
    return devices, srcs


def _given_sources(given: Any, table: dict[str, Any], name: str, where: str) -> dict[str, str]:
    """A table's ``sources`` sub-table, checked: text for settings the table gives."""
    if not isinstance(given, dict) or not all(isinstance(v, str) for v in given.values()):
        raise ConfigError(
            f"{where}: '{name}'.sources must be a table of texts, e.g. "
            f'[{name}.sources] fixed_s = "fitted: ..."'
        )
    stray = sorted(set(given) - set(table))
    if stray:
        raise ConfigError(
            f"{where}: '{name}'.sources names {', '.join(stray)}, which the table does "
            "not set; give each setting beside its source"
        )
    return given


def write_hardware_file(
    path: Path, device: Device, sources: dict[str, str], comment: str = ""
) -> None:
    """Write ``device`` as a TOML hardware file that :func:`load_devices` reads back: a table named
    after it with ``kind`` and every setting, and a ``sources`` sub-table with ``sources``' text for
    each (``comment``: lines put first, as TOML comments). Atomic: a temporary file beside
    ``path``, then renamed over it."""
    import json
    import os

    from sparsetool.checkpoint.output_files import remove, temp_beside, write_error

    def toml(v: Any) -> str:  # a JSON string or number is a TOML one; booleans are the same words
        return "true" if v is True else "false" if v is False else json.dumps(v)

    bare = re.fullmatch(r"[A-Za-z0-9_-]+", device.name)  # a TOML bare key, else quoted
    name = device.name if bare else json.dumps(device.name)
    values = _values(device)
    lines = [f"# {line}" for line in comment.splitlines()]
    lines += [f"[{name}]", f"kind = {toml(device.kind)}"]
    lines += [f"{k} = {toml(v)}" for k, v in values.items()]
    lines += ["", f"[{name}.sources]"]
    lines += [f"{k} = {toml(sources[k])}" for k in values if k in sources]
    path = Path(path)
    tmp = temp_beside(path)
    try:
        with open(
            os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "w", encoding="utf-8"
        ) as f:
            f.write("\n".join(lines) + "\n")
        os.replace(tmp, path)
    except OSError as e:  # read-only, no space, no permission: one clean line
        raise write_error(e, path, "-o") from None
    finally:
        remove(tmp)


def _values(d: Device) -> dict[str, Any]:
    return {f.name: getattr(d, f.name) for f in fields(d) if f.name != "name"}


def dataflow_grids(devices: list[Device]) -> list[tuple[int, int]]:
    """The distinct core-group grids the given dataflow devices need tile counts for."""
    grids = [d.grid for d in devices if isinstance(d, Dataflow)]
    return sorted(set(grids)) or [Dataflow(name="default").grid]


__all__ = [
    "CITATIONS",
    "PRESETS",
    "UNITS",
    "builtin_devices",
    "cite_once",
    "sources",
    "load_devices",
    "read_hardware_file",
    "dataflow_grids",
    "write_hardware_file",
]
