"""The output of ``shrink --experts``: the input's layout with fewer experts.

Every output shard's header is fixed before the first byte (the kept count is known up front):
expert ``n`` of the output takes the names expert ``n`` had in the input, so a layer's experts
``0 .. keep-1`` keep their names and the rest go; a fused tensor, the router's weight (and bias,
and DeepSeek-V3's ``e_score_correction_bias``) lose rows along their expert axis. Everything else
is copied byte for byte first; each layer's experts are written when its choice is made: copied
byte for byte from the kept experts (renumbered), or with ``--merge`` their frequency-weighted
averages, rounded to the stored type.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from sparsetool.checkpoint import Checkpoint, LogicalTensor
from sparsetool.checkpoint.format import TensorSpec
from sparsetool.checkpoint.writer import CheckpointWriter, ShardWriter
from sparsetool.errors import SparsetoolError
from sparsetool.ops.shrink.layers import ExpertLayer, Role

__all__ = ["Averaged", "ExpertWriter", "averaged"]


class ExpertWriter:
    """Writes one shrunk checkpoint: :meth:`open` fixes the headers and copies the untouched
    tensors; :meth:`layer` writes one layer's experts and router as chosen."""

    def __init__(self, ckpt: Checkpoint, layers: dict[int, ExpertLayer], experts: int, keep: int):
        self.ckpt, self.layers, self.experts, self.keep = ckpt, layers, experts, keep
        self.lts = {lt.name: lt for lt in ckpt.logical}
        self.sliced: set[str] = set()  # fused tensors and router tensors: rows along axis 0
        self.per_expert: dict[str, int] = {}  # an expert's own tensor -> its expert
        for layer in layers.values():
            for role in layer.roles:
                if role.fused:
                    self.sliced.add(role.fused)
                for e, piece in role.pieces.items():
                    self.per_expert[piece.stored] = e
            self.sliced.update(layer.router.values())
        for name in self.sliced | set(self.per_expert):
            lt = self.lts[name]
            if lt.compressed:
                raise SparsetoolError(
                    f"tensor {name!r} is stored in the bitmask encoding, which shrink cannot cut "
                    "by expert; run sparsetool densify on the model first"
                )
        for name in self.sliced:
            for part in self.lts[name].stored:
                if self.ckpt.entry(part).shape[:1] != (experts,):
                    raise SparsetoolError(
                        f"tensor {part!r} {list(self.ckpt.entry(part).shape)} should hold one row "
                        f"per expert ({experts}); shrink does not know this model's layout"
                    )
        self.writers: dict[str, ShardWriter] = {}

    # ------------------------------------------------------------------ headers and copies
    def specs(self, shard: str) -> list[TensorSpec]:
        specs: list[TensorSpec] = []
        for lt in self.ckpt.logical_in(shard):
            if self.per_expert.get(lt.name, 0) >= self.keep:
                continue  # experts keep..E-1 lose their names
            for part in lt.stored:
                e = self.ckpt.entry(part)
                shape = tuple(e.shape)
                if lt.name in self.sliced:
                    shape = (self.keep,) + shape[1:]
                specs.append(TensorSpec(part, e.st_dtype, shape))
        return specs

    @contextlib.contextmanager
    def open(self, writer: CheckpointWriter) -> Iterator[ExpertWriter]:
        """Every shard open (headers fixed), the tensors shrink leaves alone copied."""
        with contextlib.ExitStack() as stack:
            for shard in self.ckpt.shards:
                self.writers[shard] = stack.enter_context(writer.shard(shard, self.specs(shard)))
            for lt in self.ckpt.logical:
                if lt.name in self.sliced or lt.name in self.per_expert:
                    continue
                for part in lt.stored:
                    self.writers[lt.shard].copy_stored(part, self.ckpt, part)
            yield self

    # ------------------------------------------------------------------ one layer
    def layer(
        self,
        layer: ExpertLayer,
        kept: list[int],
        clusters: dict[int, list[tuple[int, float]]] | None,
        read: Callable[[str], torch.Tensor],
    ) -> None:
        """Write ``layer``'s experts and router: output expert ``n`` is input expert ``kept[n]``,
        or with ``clusters`` the average of its cluster (:func:`averaged`); ``read(name)`` gives
        a checkpoint tensor's dense values in its stored type."""
        merged = {(id(a.role), a.expert): a.value for a in averaged(layer, kept, clusters, read)}
        for role in layer.roles:
            if role.fused:
                lt = self.lts[role.fused]
                if any((id(role), n) in merged for n in range(len(kept))):
                    whole = read(role.fused)
                    rows = [merged.get((id(role), n), whole[k]) for n, k in enumerate(kept)]
                    self._write_plain(lt, torch.stack(rows))
                else:
                    self._copy_rows(lt, kept)
                continue
            for n, k in enumerate(kept):
                target = self.lts[role.pieces[n].stored]
                if (id(role), n) in merged:
                    self._write_plain(target, merged[(id(role), n)])
                else:
                    self._copy_renamed(role, self.lts[role.pieces[k].stored], target, n)
        for name in layer.router.values():
            self._copy_rows(self.lts[name], kept)

    def _copy_renamed(self, role: Role, source: LogicalTensor, target: LogicalTensor, n: int):
        parts = [role.renamed(p, n) for p in source.stored]
        if sorted(parts) != sorted(target.stored):
            raise SparsetoolError(
                f"tensor {source.name!r} is stored as {', '.join(source.stored)} but "
                f"{target.name!r} as {', '.join(target.stored)}; shrink renumbers experts stored "
                "alike: run sparsetool densify on the model first"
            )
        sw = self.writers[target.shard]
        for part, new in zip(source.stored, parts):
            sw.copy_stored(new, self.ckpt, part)

    def _copy_rows(self, lt: LogicalTensor, rows: list[int]) -> None:
        """Rows ``rows`` (along axis 0) of every stored part of ``lt``, byte for byte."""
        sw = self.writers[lt.shard]
        for part in lt.stored:
            entry = self.ckpt.entry(part)
            raw = self.ckpt.read_array(part).view(np.uint8)
            step = entry.nbytes // self.experts
            with sw.parts(part) as put:
                for n, k in enumerate(rows):
                    put(0, n * step, raw[k * step : (k + 1) * step].data)

    def _write_plain(self, lt: LogicalTensor, value: torch.Tensor) -> None:
        if len(lt.stored) != 1 or lt.stored[0] != lt.name:
            raise SparsetoolError(
                f"tensor {lt.name!r} is stored in a sparse encoding ({', '.join(lt.stored)}); "
                "--merge writes averaged experts as plain tensors: run sparsetool densify on the "
                "model first"
            )
        self.writers[lt.shard].write(lt.name, value.to(lt.dtype).contiguous())


@dataclass(frozen=True)
class Averaged:
    """Output expert ``expert``'s matrix of ``role``, averaged from its cluster, and its place in
    the shrunk parameter (``index``)."""

    role: Role
    expert: int
    index: tuple
    value: torch.Tensor


def averaged(
    layer: ExpertLayer,
    kept: list[int],
    clusters: dict[int, list[tuple[int, float]]] | None,
    read: Callable[[str], torch.Tensor],
) -> list[Averaged]:
    """``--merge``: every matrix of an output expert whose cluster holds more than itself, as the
    weighted average of its members' (float32 sums, rounded to the stored type)."""
    out: list[Averaged] = []
    if not clusters:
        return out
    for role in layer.roles:
        whole = read(role.fused) if role.fused else None
        for n, k in enumerate(kept):
            group = clusters[k]
            if len(group) == 1:
                continue
            if whole is not None:
                value = _average([whole[j] for j, _ in group], group)
                out.append(Averaged(role, n, (n,), value))
            else:
                value = _average([read(role.pieces[j].stored) for j, _ in group], group)
                out.append(Averaged(role, n, role.index(role.pieces[n], n), value))
    return out


def _average(values: list[torch.Tensor], group: list[tuple[int, float]]) -> torch.Tensor:
    """The weighted average of an expert's matrices (float32 sums), in their stored type."""
    total = torch.zeros(values[0].shape, dtype=torch.float32)
    for v, (_j, w) in zip(values, group):
        total += w * v.float()
    return total.to(values[0].dtype)
