"""The file-order planner: magnitude or random masks, layer or global scope, N:M.

Layer scope needs nothing global: each tensor keeps its own count (``--sparsity`` through the
distribution, :func:`~sparsetool.masks.distributions.keep_counts`). A fused experts tensor (layout
``stacked`` or ``stacked_t``, :class:`~sparsetool.targets.TargetEntry`) is one matrix per expert,
and at layer scope each expert's matrix keeps its own count
(:func:`~sparsetool.masks.distributions.part_keep_counts`), chosen among its own weights; N:M
groups run along each expert's input dimension; at global scope every expert's weights are just
part of the one pool. ``--fraction`` needs each
tensor's non-zeros first, ``--scope global`` one threshold across every targeted tensor
(:mod:`sparsetool.masks.global_magnitude`), and the ``bitmask`` encoding the kept count of each
tensor for the output's header: those are the first pass, :meth:`MagnitudePlanner.prepare`.
"""

from __future__ import annotations

import zlib

import numpy as np

from sparsetool.checkpoint.codecs import codec
from sparsetool.checkpoint.reader import Checkpoint, LogicalTensor
from sparsetool.checkpoint.writer import ShardWriter
from sparsetool.errors import SparsetoolError
from sparsetool.masks.counts import fraction_keep
from sparsetool.masks.distributions import part_keep_counts
from sparsetool.masks.global_magnitude import (
    GlobalPlan,
    MagnitudeHistogram,
    apply_threshold,
    global_threshold_plan,
)
from sparsetool.masks.histograms import sampled_histogram
from sparsetool.masks.kernel import Scan
from sparsetool.masks.keys import magnitude_keys
from sparsetool.masks.select import magnitude_mask, nm_mask, random_mask
from sparsetool.ops.prune.options import PruneOptions
from sparsetool.ops.prune.read import read_alive, recorded_nan_encoding
from sparsetool.ops.prune.stream import Scanned, stream_plan, stream_top, stream_top_parts, streams
from sparsetool.targets import STACKED_LAYOUTS, TargetPlan
from sparsetool.util.progress import Progress

__all__ = ["MagnitudePlanner"]


class MagnitudePlanner:
    """Decides each targeted tensor's mask in file order (a
    :class:`~sparsetool.ops.prune.planner.FileOrderPlanner`)."""

    def __init__(
        self,
        ckpt: Checkpoint,
        targets: list[LogicalTensor],
        opts: PruneOptions,
        plan: TargetPlan,
        *,
        progress: Progress | None = None,
    ):
        self.ckpt, self.targets, self.opts, self.progress = ckpt, targets, opts, progress
        self.target_plan = plan
        self._index = {lt.name: i for i, lt in enumerate(targets)}
        self.keep: dict[str, list[int]] = {}  # layer scope: the count kept of each part
        self.global_plan: GlobalPlan | None = None
        self.nonzero_after: dict[str, int] = {}
        self.nonzero_before: dict[str, int] = {}
        # NaN already in the input is a sentinel only if the input says it was written as one.
        self.nan_ok = recorded_nan_encoding(ckpt)
        self.plain: set[str] = set()  # global scope: plain finite tensors (zeros the only pruned)
        self._zeros: dict[str, int] = {}  # and their zeros
        if opts.sparsity is not None and opts.scope == "layer":
            shapes = {lt.name: tuple(lt.shape) for lt in targets}
            parts = {lt.name: self._parts(lt) for lt in targets}
            self.keep = part_keep_counts(shapes, parts, opts.sparsity, opts.distribution)

    def _parts(self, lt: LogicalTensor) -> int:
        """How many matrices ``lt`` holds, each pruned as a unit at layer scope: a fused experts
        tensor's experts, else 1."""
        return max(1, self.target_plan[lt.name].experts)

    @property
    def needs_first_pass(self) -> bool:
        o = self.opts
        return (
            o.fraction is not None or o.scope == "global" or codec(o.encoding).kept_counts_in_header
        )

    def prepare(self) -> None:
        """The first pass, when one is needed: non-zeros, histograms, kept counts."""
        if not self.needs_first_pass:
            return
        o = self.opts
        hists: list[MagnitudeHistogram | None] = []
        estimate: np.ndarray | None = None  # global scope: the first digits' counts, roughly
        total_nnz = 0
        for i, lt in enumerate(self.targets):
            if o.scope == "global" and self._streams(lt) and lt.st_dtype in ("BF16", "F32"):
                scanned = Scanned(self.ckpt, lt)  # one pass: zeros, inf/NaN
                if scanned.finite:  # its zeros are the only weights already pruned
                    self.plain.add(lt.name)
                    self.nonzero_before[lt.name] = scanned.nonzero
                    total_nnz += scanned.nonzero
                    # its histogram waits for the threshold's rough place, found from samples
                    sample = sampled_histogram(scanned.keys)
                    sample[0] = max(0.0, sample[0] - scanned.found.zeros)
                    self._zeros[lt.name] = scanned.found.zeros
                    estimate = sample if estimate is None else estimate + sample
                    hists.append(None)
                    if self.progress:
                        self.progress("scan", i + 1, len(self.targets))
                    continue
            dense, existing = read_alive(self.ckpt, lt, nan_means_pruned=self.nan_ok)
            nnz = int(np.count_nonzero(existing))
            self.nonzero_before[lt.name] = nnz
            total_nnz += nnz
            if o.scope == "global":
                hist = MagnitudeHistogram.of(dense, existing, dtype=lt.st_dtype)
                hists.append(hist)
                counts = hist.counts.astype(np.float64)
                estimate = counts if estimate is None else estimate + counts
            elif o.fraction is not None:
                alive = existing.reshape(self._parts(lt), -1)
                self.keep[lt.name] = [
                    fraction_keep(int(np.count_nonzero(row)), o.fraction) for row in alive
                ]
            if codec(o.encoding).kept_counts_in_header and o.scope == "layer":
                # The compressed size goes into the header, so count the result now.
                self.nonzero_after[lt.name] = int(np.count_nonzero(self._mask(lt, dense, existing)))
            if self.progress:
                self.progress("scan", i + 1, len(self.targets))
        if o.scope == "global":
            if o.fraction is not None:
                total_keep = fraction_keep(total_nnz, o.fraction)
            else:
                assert o.sparsity is not None  # validate(): --nm takes no --scope global
                numel = sum(lt.numel for lt in self.targets)
                total_keep = numel - round(o.sparsity * numel)
            self.global_plan = self._global_plan(
                self._plain_histograms(hists, estimate, total_keep), total_keep
            )
            if codec(o.encoding).kept_counts_in_header:
                for lt in self.targets:
                    dense, existing = read_alive(self.ckpt, lt, nan_means_pruned=self.nan_ok)
                    self.nonzero_after[lt.name] = int(
                        np.count_nonzero(self._mask(lt, dense, existing))
                    )

    def _plain_histograms(
        self, hists: list[MagnitudeHistogram | None], estimate: np.ndarray | None, keep: int
    ) -> list[MagnitudeHistogram]:
        """The histograms of the plain tensors the first pass left for later. The threshold lies
        near where the samples put it: each tensor's buckets are counted one by one only around
        that place (a few comparisons per weight instead of a whole histogram), the rest in two
        sums; if the exact counts show the boundary outside after all, every bucket is counted."""
        low, high = 0, None
        if estimate is not None:
            suffix = np.cumsum(estimate[::-1])[::-1]
            available = float(suffix[0])  # not estimate.sum(): the two round differently
            if 0 < keep < available:  # else no boundary is needed

                def digit(count: float) -> int:  # the boundary digit if ``count`` were kept
                    return int(np.flatnonzero(suffix >= min(max(count, 1.0), available))[-1])

                # 2% and some either side: far more than the samples' error
                low = max(0, digit(keep * 1.02 + 4096) - 1)
                high = digit(keep * 0.98 - 4096) + 1

        def fill(low: int, high: int | None) -> list[MagnitudeHistogram]:
            out = []
            for i, h in enumerate(hists):
                if h is None:  # a finite plain tensor: its keys, and its zeros counted before
                    lt = self.targets[i]
                    keys = magnitude_keys(self.ckpt.read_array(lt.stored[0]), dtype=lt.st_dtype)
                    h = MagnitudeHistogram.of_scan(
                        Scan(keys, 0, self._zeros[lt.name]), lt.st_dtype, low=low, high=high
                    )
                    if self.progress:
                        self.progress("histogram", i + 1, len(hists))
                out.append(h)
            return out

        done = fill(low, high)
        if low or high is not None:
            total = sum(h.counts for h in done)
            if isinstance(total, int):  # an estimate means a targeted tensor: a histogram
                raise AssertionError("no histogram to sum")
            last = len(total) - 1 if high is None else min(high, len(total) - 1)
            if not int(total[last + 1 :].sum()) < keep <= int(total[low:].sum()):
                done = fill(0, None)  # the samples misled (a rare, skewed file): count every bucket
        return done

    def _global_plan(self, hists: list[MagnitudeHistogram], total_keep: int) -> GlobalPlan:
        plan = global_threshold_plan(hists, total_keep)
        if not plan.done:
            # The boundary bucket holds distinct fp16/fp32 values: re-read only the tensors that
            # have entries in it.
            fine = {}
            for i in plan.refine:
                lt = self.targets[i]
                dense, existing = read_alive(self.ckpt, lt, nan_means_pruned=self.nan_ok)
                fine[i] = MagnitudeHistogram.of(
                    dense, existing, refine=plan.refine_bucket, dtype=lt.st_dtype
                )
                if self.progress:
                    self.progress("refine", len(fine), len(plan.refine))
            plan = global_threshold_plan(hists, total_keep, refined=fine)
        return plan

    def _mask(self, lt: LogicalTensor, dense: np.ndarray, existing: np.ndarray) -> np.ndarray:
        """The kept mask of ``lt`` from its values as stored (bits) and its alive mask."""
        o = self.opts
        if o.nm is not None:
            n, m = o.nm
            entry = self.target_plan[lt.name]
            if entry.layout not in ("linear", "conv1d", *STACKED_LAYOUTS):
                raise SparsetoolError(
                    f"tensor {lt.name!r} {list(lt.shape)}: --nm needs the input dimension, which "
                    f"is not known for a {len(lt.shape)}-D tensor of role {entry.role}; leave it "
                    f"out with --exclude '{lt.name}' or prune it without --nm"
                )
            try:  # a fused experts tensor: its groups run along each expert's input axis
                return nm_mask(
                    dense, n, m, dim=entry.input_dim, existing=existing, dtype=lt.st_dtype
                )
            except SparsetoolError as e:
                raise SparsetoolError(f"tensor {lt.name!r} {list(lt.shape)}: {e}") from None
        if o.scope == "global":
            assert self.global_plan is not None, "prepare() first"
            return apply_threshold(
                dense, self.global_plan.tensors[self._index[lt.name]], existing, dtype=lt.st_dtype
            )
        keeps = self._layer_keep(lt)
        if len(keeps) == 1:
            return self._select(lt, dense, existing, keeps[0], lt.name)
        values, alive = dense.reshape(len(keeps), -1), existing.reshape(len(keeps), -1)
        mask = np.empty(values.shape, dtype=np.bool_)
        for expert, keep in enumerate(keeps):  # each expert's matrix on its own
            unit = f"{lt.name}[{expert}]"
            mask[expert] = self._select(lt, values[expert], alive[expert], keep, unit)
        return mask.reshape(tuple(lt.shape))

    def _select(
        self, lt: LogicalTensor, dense: np.ndarray, existing: np.ndarray, keep: int, unit: str
    ) -> np.ndarray:
        """Layer scope: the mask keeping ``keep`` of one unit (a tensor, or one expert's matrix)."""
        if self.opts.method == "random":
            return random_mask(
                dense.shape, keep=keep, existing=existing, seed=tensor_seed(self.opts.seed, unit)
            )
        return magnitude_mask(dense, keep=keep, existing=existing, dtype=lt.st_dtype)

    def _streams(self, lt: LogicalTensor) -> bool:
        o = self.opts
        return o.method == "magnitude" and o.nm is None and streams(lt, o.encoding)

    def stream(self, lt: LogicalTensor, sw: ShardWriter) -> tuple[int, int] | None:
        """Write ``lt`` by the fast path (:mod:`sparsetool.ops.prune.stream`): (non-zeros before,
        kept), or None, having written nothing, when :meth:`mask` must take it."""
        if not self._streams(lt):
            return None
        if self.opts.scope == "layer":
            keeps = self._layer_keep(lt)
            if len(keeps) > 1:
                return stream_top_parts(self.ckpt, lt, sw, keeps, self.opts.encoding)
            return stream_top(self.ckpt, lt, sw, keeps[0], self.opts.encoding)
        if lt.name in self.plain:  # global scope, scanned by prepare
            assert self.global_plan is not None, "prepare() first"
            plan = self.global_plan.tensors[self._index[lt.name]]
            kept = stream_plan(self.ckpt, lt, sw, plan, self.opts.encoding)
            return self.nonzero_before[lt.name], kept
        return None

    def _layer_keep(self, lt: LogicalTensor) -> list[int]:
        """Layer scope: the count kept of each of ``lt``'s parts (:meth:`_parts`)."""
        keep = self.keep.get(lt.name)
        if keep is None:  # layer scope --sparsity (--fraction always has a first pass)
            assert self.opts.sparsity is not None
            size = lt.numel // self._parts(lt)
            keep = [size - round(self.opts.sparsity * size)] * self._parts(lt)
        return keep

    def mask(self, lt: LogicalTensor) -> tuple[np.ndarray, np.ndarray, int]:
        """``lt`` whole: (its values, the kept mask, its non-zeros before pruning)."""
        dense, existing = read_alive(self.ckpt, lt, nan_means_pruned=self.nan_ok)
        mask = self._mask(lt, dense, existing)
        before = self.nonzero_before.get(lt.name)
        if before is None:
            before = int(np.count_nonzero(existing))
        return dense, mask, before


def tensor_seed(seed: int, name: str) -> int:
    """A per-tensor seed that depends only on (seed, name): same masks whatever the file order."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63 - 1)
