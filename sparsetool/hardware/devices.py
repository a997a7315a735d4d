"""The cost of one pass of one pruned matmul on each kind of hardware.

A layer is an ``M x K`` weight with ``nnz`` non-zeros, applied to ``T`` tokens. Three passes make a
training step (backward = 2 x forward, Chinchilla Appendix F as the SPDF paper uses it):
forward ``y = x W^T``, backward-data ``dx = dy W`` and backward-weight ``dW = dy^T x`` (only at the
kept positions: the gradient of a pruned weight is never needed with a static mask).

Every cost is a :class:`Cost`: ``compute`` (the work at the mean rate), ``imbalance`` (extra time
the busiest core group needs beyond the mean), ``memory`` (moving the weights and activations),
``fixed`` (per-kernel work sparsity does not shrink). Compute and memory overlap, so
``total = max(compute + imbalance, memory) + fixed`` (roofline; Williams, Waterman and Patterson,
"Roofline", CACM 2009).

Every device runs a layer with no zeros on its dense path, so the speedup at sparsity 0 is
exactly 1.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from sparsetool.hardware.layers import LayerMask
from sparsetool.util.wording import plural

PASSES = ("forward", "backward_data", "backward_weight")


@dataclass(frozen=True)
class Cost:
    """Seconds, split by cause. ``total`` is not the sum: compute and memory overlap."""

    compute: float = 0.0
    memory: float = 0.0
    fixed: float = 0.0
    imbalance: float = 0.0
    total: float = 0.0

    @staticmethod
    def roofline(compute: float, memory: float, fixed: float, imbalance: float = 0.0) -> Cost:
        return Cost(compute, memory, fixed, imbalance, max(compute + imbalance, memory) + fixed)

    def __add__(self, o: Cost) -> Cost:
        return Cost(*(getattr(self, f.name) + getattr(o, f.name) for f in fields(Cost)))

    def scaled(self, c: float) -> Cost:
        return Cost(*(getattr(self, f.name) * c for f in fields(Cost)))

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(Cost)}


class Refused(Exception):
    """The device cannot run this mask at all (for instance 2:4 cores on a mask that is not 2:4)."""


@dataclass(frozen=True)
class Device:
    """Base: a named device. Subclasses give :meth:`dense_cost`, :meth:`sparse_cost` and
    :meth:`untargeted_cost` (dense work such as attention that weight sparsity leaves alone)."""

    name: str
    kind: ClassVar[str] = "device"

    def cost(self, layer: LayerMask, tokens: float, pass_: str) -> Cost:
        if layer.is_dense:
            return self.dense_cost(layer, tokens, pass_)
        return self.sparse_cost(layer, tokens, pass_)

    def dense_cost(self, layer: LayerMask, tokens: float, pass_: str) -> Cost:
        raise NotImplementedError

    def sparse_cost(self, layer: LayerMask, tokens: float, pass_: str) -> Cost:
        raise NotImplementedError

    def untargeted_cost(self, flops: float) -> Cost:
        raise NotImplementedError

    def notes(self, layers: list[LayerMask], passes: tuple[str, ...]) -> list[str]:
        """Plain-language caveats for this device on these layers (what ran dense and why)."""
        return []


@dataclass(frozen=True)
class Dataflow(Device):
    """A zero-skipping dataflow machine (CS-2-like, Lie 2022 and the seed post "Harnessing the
    power of sparsity for large GPT AI models": "a sparse GEMM is ... one AXPY per non-zero").

    The ``M x K`` weight is split into a ``groups_m x groups_k`` grid of tiles; core group
    ``(i, j)`` holds the activations of input features ``K_j`` for all ``T`` tokens (spread over
    its cores) and accumulates partial sums for outputs ``M_i``. Each non-zero ``w[m, k]`` is sent
    to its group and triggers ``T`` multiply-adds there; zeros are never sent. Cores are shared in
    proportion to tile size (what a mapper balancing the dense layer would do), so a group's time is
    ``density(tile) * dense_time`` and the step waits for the densest tile:

        compute   = nnz * T / (cores * fmac_per_core_cycle * clock_hz)
        imbalance = (max_tile_density / density - 1) * compute
        memory    = weight bytes / (sram_bandwidth, or stream_bandwidth when weight_streaming)
        fixed     = fixed_s + partial sums (T x outputs x (groups along the reduction - 1)) / fabric

    The same count of multiply-adds serves all three passes (backward-data sends each non-zero to
    the groups holding ``dy[:, m]``; backward-weight does one length-``T`` dot product per
    non-zero), so the same tile imbalance applies to each. Compute and the weight stream overlap
    (weights flow in while earlier ones are used), hence the ``max`` of the roofline rather than a
    sum. When resident weights exceed ``sram_bytes``, :meth:`notes` says so.
    """

    kind: ClassVar[str] = "dataflow"
    cores: int = 850_000
    clock_hz: float = 1.1e9
    fmac_per_core_cycle: float = 4.0
    sram_bandwidth: float = 20e15
    sram_bytes: float = 40e9
    fabric_bandwidth: float = 27.5e15
    groups_m: int = 32
    groups_k: int = 32
    fixed_s: float = 0.0
    weight_streaming: bool = False
    stream_bandwidth: float = 150e9
    weight_bytes: float = 2.0
    index_bytes: float = 2.0
    partial_sum_bytes: float = 4.0
    dense_fallback: bool = True

    def cost(self, layer: LayerMask, tokens: float, pass_: str) -> Cost:
        """The sparse kernel, or the dense one where that is faster and ``dense_fallback`` is on
        (a compiler picks per layer: below ~50% sparsity the index each non-zero carries makes a
        streamed sparse layer slower than the dense one)."""
        return self._choose(layer, tokens, pass_)[1]

    def path(self, layer: LayerMask, tokens: float, pass_: str) -> str:
        """Which kernel :meth:`cost` runs for this layer: ``"sparse"`` or ``"dense"``."""
        return self._choose(layer, tokens, pass_)[0]

    def _choose(self, layer: LayerMask, tokens: float, pass_: str) -> tuple[str, Cost]:
        if layer.is_dense:
            return "dense", self.dense_cost(layer, tokens, pass_)
        sparse = self.sparse_cost(layer, tokens, pass_)
        if self.dense_fallback and sparse.total > self._dense_floor(layer, tokens, pass_):
            dense = self.dense_cost(layer, tokens, pass_)
            if dense.total < sparse.total:
                return "dense", dense
        return "sparse", sparse

    def _dense_floor(self, layer: LayerMask, tokens: float, pass_: str) -> float:
        """A lower bound of the dense kernel's time (its compute alone): a sparse time below it
        needs no dense cost computed."""
        return layer.numel * tokens / self.fmac_rate

    @property
    def grid(self) -> tuple[int, int]:
        return (self.groups_m, self.groups_k)

    @property
    def fmac_rate(self) -> float:
        """Multiply-adds per second of the whole machine (peak FLOP/s is twice this)."""
        return self.cores * self.fmac_per_core_cycle * self.clock_hz

    def _reduction(self, layer: LayerMask, tokens: float, pass_: str) -> float:
        gm, gk = min(self.groups_m, layer.out_features), min(self.groups_k, layer.in_features)
        if pass_ == "forward":
            moved = tokens * layer.out_features * (gk - 1)
        elif pass_ == "backward_data":
            moved = tokens * layer.in_features * (gm - 1)
        else:  # each non-zero's gradient is summed over the cores holding its tokens
            moved = layer.nnz
        return moved * self.partial_sum_bytes / self.fabric_bandwidth

    def _weights(self, nnz: float, dense: bool) -> float:
        per = self.weight_bytes + (0.0 if dense else self.index_bytes)
        bw = self.stream_bandwidth if self.weight_streaming else self.sram_bandwidth
        return nnz * per / bw

    def dense_cost(self, layer: LayerMask, tokens: float, pass_: str) -> Cost:
        compute = layer.numel * tokens / self.fmac_rate
        return Cost.roofline(
            compute,
            self._weights(layer.numel, True),
            self.fixed_s + self._reduction(layer, tokens, pass_),
        )

    def sparse_cost(self, layer: LayerMask, tokens: float, pass_: str) -> Cost:
        compute = layer.nnz * tokens / self.fmac_rate
        imbalance = (layer.busiest_over_mean(self.grid) - 1.0) * compute
        return Cost.roofline(
            compute,
            self._weights(layer.nnz, False),
            self.fixed_s + self._reduction(layer, tokens, pass_),
            imbalance,
        )

    def untargeted_cost(self, flops: float) -> Cost:
        return Cost.roofline(flops / (2 * self.fmac_rate), 0.0, 0.0)

    def notes(self, layers: list[LayerMask], passes: tuple[str, ...]) -> list[str]:
        out = []
        small = [
            ly for ly in layers if ly.out_features < self.groups_m or ly.in_features < self.groups_k
        ]
        if small:
            ly = small[0]
            out.append(
                f"{len(small)} of {plural(len(layers), 'layer')} have fewer rows or columns than "
                f"the {self.groups_m} x {self.groups_k} core-group grid (e.g. {ly.name}, "
                f"{ly.out_features} x {ly.in_features}): they use only min(grid, shape) groups"
            )
        if self.weight_streaming:
            return out
        held = sum(
            ly.numel * self.weight_bytes
            if ly.is_dense
            else ly.nnz * (self.weight_bytes + self.index_bytes)
            for ly in layers
        )
        if held > self.sram_bytes:
            out.append(
                f"the pruned weights ({held / 1e9:.1f} GB) do not fit in the "
                f"{self.sram_bytes / 1e9:g} GB "
                "of on-chip SRAM: set weight_streaming = true in a --hardware file"
            )
        return out


@dataclass(frozen=True)
class DenseGPU(Device):
    """A GPU running cuBLAS on tensor cores: zeros are multiplied like any other number.

    ``compute = 2 T M K / (eta * peak_flops)``, ``memory = (T K + M K + T M) * value_bytes /
    (eta_mem * bandwidth)``, ``fixed = launch_s``. Unstructured sparsity buys exactly nothing.
    """

    kind: ClassVar[str] = "gpu-dense"
    peak_flops: float = 312e12
    bandwidth: float = 2.039e12
    eta: float = 0.65
    eta_mem: float = 0.8
    launch_s: float = 5e-6
    value_bytes: float = 2.0

    def _act_bytes(self, layer: LayerMask, tokens: float) -> float:
        return tokens * (layer.in_features + layer.out_features) * self.value_bytes

    def dense_cost(self, layer: LayerMask, tokens: float, pass_: str) -> Cost:
        flops = 2.0 * tokens * layer.numel
        bytes_ = self._act_bytes(layer, tokens) + layer.numel * self.value_bytes
        return Cost.roofline(
            flops / (self.eta * self.peak_flops),
            bytes_ / (self.eta_mem * self.bandwidth),
            self.launch_s,
        )

    def sparse_cost(self, layer: LayerMask, tokens: float, pass_: str) -> Cost:
        return self.dense_cost(layer, tokens, pass_)

    def untargeted_cost(self, flops: float) -> Cost:
        return Cost.roofline(flops / (self.eta * self.peak_flops), 0.0, 0.0)


@dataclass(frozen=True)
class Sparse24GPU(DenseGPU):
    """2:4 structured-sparse tensor cores (NVIDIA Ampere and later).

    Only for a mask that keeps at most 2 of every 4 consecutive weights along the reduction
    dimension: K for forward, M for backward-data (``W^T``). The math runs ``math_speedup`` times
    faster (hardware limit 2; PyTorch's measured 538 us / 387 us = 1.39x); the weights are stored
    at half size plus ``metadata_bytes`` per kept value. Backward-weight produces a dense gradient
    and runs on the dense path. A forward mask that is not 2:4 is refused (:class:`Refused`);
    a backward-data mask that is not 2:4 along M runs dense and says so in :meth:`notes`.
    """

    kind: ClassVar[str] = "gpu-2:4"
    math_speedup: float = 1.39
    metadata_bytes: float = 0.25

    def _fits(self, layer: LayerMask, pass_: str) -> bool:
        v = layer.nm_violation_in if pass_ == "forward" else layer.nm_violation_out
        return v == 0.0

    def sparse_cost(self, layer: LayerMask, tokens: float, pass_: str) -> Cost:
        if pass_ == "forward" and not self._fits(layer, pass_):
            v = layer.nm_violation_in
            why = (
                "K is not a multiple of 4"
                if v is None
                else f"{v:.1%} of its groups of 4 along K keep more than 2"
            )
            raise Refused(f"{layer.name} is not 2:4 along its input dimension ({why})")
        if pass_ == "backward_weight" or not self._fits(layer, pass_):
            return self.dense_cost(layer, tokens, pass_)
        flops = 2.0 * tokens * layer.numel / self.math_speedup
        bytes_ = self._act_bytes(layer, tokens) + layer.numel / 2 * (
            self.value_bytes + self.metadata_bytes
        )
        return Cost.roofline(
            flops / (self.eta * self.peak_flops),
            bytes_ / (self.eta_mem * self.bandwidth),
            self.launch_s,
        )

    def notes(self, layers: list[LayerMask], passes: tuple[str, ...]) -> list[str]:
        out = []
        sparse = [ly for ly in layers if not ly.is_dense]
        if "backward_data" in passes:
            bad = [ly for ly in sparse if not self._fits(ly, "backward_data")]
            if bad:
                out.append(
                    f"backward-data runs dense in {len(bad)} of "
                    f"{plural(len(sparse), 'sparse layer')}: "
                    "W^T is not 2:4 along the output dimension"
                )
        if "backward_weight" in passes and sparse:
            out.append("backward-weight runs dense (the weight gradient is a dense product)")
        return out


@dataclass(frozen=True)
class SpMMGPU(DenseGPU):
    """An unstructured sparse-times-dense kernel on CUDA cores (Sputnik, cuSPARSE classes).

    It skips the zeros but runs each remaining multiply-add far slower than a tensor core does;
    its effective rate is set by the published break-even with dense cuBLAS: at
    ``break_even_sparsity`` the sparse compute time equals the dense one, so
    ``compute = 2 T nnz / ((1 - break_even_sparsity) * eta * peak_flops)``. Memory: activations
    plus each non-zero's value and ``index_bytes`` of column index (CSR). Backward-weight is the
    matching sampled dense-dense product (SDDMM), assumed to cost the same.
    """

    kind: ClassVar[str] = "gpu-spmm"
    break_even_sparsity: float = 0.90
    index_bytes: float = 4.0

    def sparse_cost(self, layer: LayerMask, tokens: float, pass_: str) -> Cost:
        rate = (1.0 - self.break_even_sparsity) * self.eta * self.peak_flops
        bytes_ = self._act_bytes(layer, tokens) + layer.nnz * (self.value_bytes + self.index_bytes)
        return Cost.roofline(
            2.0 * tokens * layer.nnz / rate, bytes_ / (self.eta_mem * self.bandwidth), self.launch_s
        )


@dataclass(frozen=True)
class FlashLLMGPU(DenseGPU):
    """ "Load as sparse, compute as dense" (Flash-LLM class, Xia et al., VLDB 2024).

    The weights travel from memory compressed and are expanded on chip; the tensor cores still do
    every multiply-add, so the kernel gains only where memory traffic sets the pace: the skinny
    (few tokens) regime of inference. Weight traffic, relative to the dense weights, is
    ``floor + slope * density``, both fitted to the published speedups (see ``fits``). An inference
    kernel: backward passes run on the dense path.
    """

    kind: ClassVar[str] = "gpu-flash-llm"
    floor: float = 0.355
    slope: float = 1.19

    def sparse_cost(self, layer: LayerMask, tokens: float, pass_: str) -> Cost:
        if pass_ != "forward":
            return self.dense_cost(layer, tokens, pass_)
        weights = layer.numel * self.value_bytes * (self.floor + self.slope * layer.density)
        bytes_ = self._act_bytes(layer, tokens) + weights
        return Cost.roofline(
            2.0 * tokens * layer.numel / (self.eta * self.peak_flops),
            bytes_ / (self.eta_mem * self.bandwidth),
            self.launch_s,
        )

    def notes(self, layers: list[LayerMask], passes: tuple[str, ...]) -> list[str]:
        if set(passes) - {"forward"}:
            return ["an inference kernel: backward passes run dense"]
        return []


@dataclass(frozen=True)
class CPU(Device):
    """A multi-core CPU running a BLAS GEMM for dense layers and a CSR-class sparse kernel (a
    compressed-sparse-row weight times the dense activations: scipy's or torch's CSR product) for
    pruned ones. Two rooflines with few parameters, each an effective (achieved) rate rather than a
    peak, so that ``sparsetool simulate --measured BENCH.json --fit`` can fit them to timings:

        dense   = max(2 T M K / dense_flops, (M K + T (K + M)) * value_bytes / bandwidth) + launch_s
        sparse  = max(T nnz / sparse_mac_rate,
                      (nnz (value_bytes + index_bytes) + (M + 1) index_bytes
                       + T (K + M) value_bytes) / sparse_bandwidth) + sparse_launch_s

    ``dense_flops``: FLOP/s the dense GEMM reaches; ``bandwidth``: bytes/s it streams weights and
    activations at; ``launch_s``: its per-call overhead. ``sparse_mac_rate``: multiply-adds per
    second of the CSR kernel (each non-zero meets ``T`` activations through its column index);
    ``sparse_bandwidth``: bytes/s it streams the CSR arrays (values, column indices, row pointers)
    and the activations at; ``sparse_launch_s``: its per-call overhead (format checks, dispatch).
    ``value_bytes``/``index_bytes``: the sizes of a weight and of an index (CSR stores one column
    index per non-zero and ``M + 1`` row pointers).

    With ``sparse_mac_rate <= dense_flops / 2``, ``sparse_bandwidth <= bandwidth`` and
    ``sparse_launch_s >= launch_s`` (the preset's case) the speedup never exceeds ``1/(1-s)``; a
    fit to measurements imposes none of these (a measured dense kernel may be the slower one).

    Backward passes (an assumption: CPUs have no sampled dense-dense kernel in common use):
    backward-data ``dx = dy W`` runs the same CSR kernel on ``W^T`` (``K + 1`` row pointers);
    backward-weight ``dW = dy^T x`` runs the dense GEMM (the gradient is dense, masked after).
    """

    kind: ClassVar[str] = "cpu"
    dense_flops: float = 120e9
    bandwidth: float = 15e9
    launch_s: float = 5e-6
    sparse_mac_rate: float = 2.5e9
    sparse_bandwidth: float = 8e9
    sparse_launch_s: float = 5e-6
    value_bytes: float = 4.0
    index_bytes: float = 4.0

    def _act_bytes(self, layer: LayerMask, tokens: float) -> float:
        return tokens * (layer.in_features + layer.out_features) * self.value_bytes

    def dense_cost(self, layer: LayerMask, tokens: float, pass_: str) -> Cost:
        bytes_ = layer.numel * self.value_bytes + self._act_bytes(layer, tokens)
        return Cost.roofline(
            2.0 * tokens * layer.numel / self.dense_flops, bytes_ / self.bandwidth, self.launch_s
        )

    def sparse_cost(self, layer: LayerMask, tokens: float, pass_: str) -> Cost:
        if pass_ == "backward_weight":
            return self.dense_cost(layer, tokens, pass_)
        rows = layer.out_features if pass_ == "forward" else layer.in_features
        bytes_ = (
            layer.nnz * (self.value_bytes + self.index_bytes)
            + (rows + 1) * self.index_bytes
            + self._act_bytes(layer, tokens)
        )
        return Cost.roofline(
            tokens * layer.nnz / self.sparse_mac_rate,
            bytes_ / self.sparse_bandwidth,
            self.sparse_launch_s,
        )

    def untargeted_cost(self, flops: float) -> Cost:
        return Cost.roofline(flops / self.dense_flops, 0.0, 0.0)

    def notes(self, layers: list[LayerMask], passes: tuple[str, ...]) -> list[str]:
        if "backward_weight" in passes and any(not ly.is_dense for ly in layers):
            return ["backward-weight runs dense (the weight gradient is a dense product)"]
        return []


KINDS: dict[str, type[Device]] = {
    c.kind: c for c in (Dataflow, DenseGPU, Sparse24GPU, SpMMGPU, FlashLLMGPU, CPU)
}
