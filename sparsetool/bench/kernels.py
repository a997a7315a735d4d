"""The matrix products ``sparsetool bench`` times: one layer, ``y = x @ W.T``, ``x`` of shape
``(batch, K)`` and a masked weight ``W`` of shape ``(M, K)``.

A kernel is built once per weight (its own storage: dense, CSR, 2:4 compressed) and once per
input (the layout it takes), then only its product is timed. The layouts are those a chain of
such layers would keep: torch's kernels take ``x`` as ``(batch, K)`` and give ``(batch, M)``; the
CSR kernels compute ``W @ x.T``, taking ``(K, batch)`` and giving ``(M, batch)``, which is the
next layer's input as it is, so no transposition belongs in their time either.

CPU: the dense baseline is the fastest of torch's dense products for the dtype (for bfloat16 the
float32 product of the same values is a candidate: on CPUs without bfloat16 matrix units it is
the faster one). The sparse kernels hold float32 values (scipy has no bfloat16; the values are
the same numbers): SciPy's CSR (``scipy-csr``, one thread), the same split into row bands of
equal non-zero count, one per thread (``scipy-csr-rows``: SciPy's sparse products release the
GIL), and torch's CSR (``torch-csr``). CUDA: cuBLAS dense, torch's CSR (cuSPARSE) and, for a
mask that keeps 2 of every 4 along K, 2:4 semi-structured
(``torch.sparse.to_sparse_semi_structured``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names need no torch: options are checked before torch is imported
    import torch

CPU_DENSE = ("torch-linear", "torch-linear-float32")  # the second only where dtype is not float32
CPU_SPARSE = ("scipy-csr", "scipy-csr-rows", "torch-csr")
CUDA_DENSE = ("cublas",)
CUDA_SPARSE = ("cusparse-csr", "semi-structured-2:4")
SPARSE = CPU_SPARSE + CUDA_SPARSE

WHAT = {
    "torch-linear": "torch.nn.functional.linear in the dtype timed",
    "torch-linear-float32": "torch.nn.functional.linear in float32 on the same values",
    "scipy-csr": "SciPy CSR times the (K, batch) input, one thread",
    "scipy-csr-rows": "SciPy CSR in row bands of equal non-zeros, one band per thread",
    "torch-csr": "torch.sparse.mm on a torch CSR tensor",
    "cublas": "torch.nn.functional.linear on the GPU (cuBLAS)",
    "cusparse-csr": "torch.sparse.mm on a CUDA CSR tensor (cuSPARSE)",
    "semi-structured-2:4": "torch.nn.functional.linear on a 2:4 semi-structured weight",
}


class Unavailable(Exception):
    """This kernel cannot run here or on this weight; the message says why."""


@dataclass
class Kernel:
    """One product ready to time: ``run(prepared)`` where ``prepared = take(x)``; ``result``
    turns its output back into a ``(batch, M)`` float32 tensor on the CPU (not timed)."""

    name: str
    take: Callable[[torch.Tensor], Any]
    run: Callable[[Any], Any]
    result: Callable[[Any], torch.Tensor]
    sync: Callable[[], None] | None = None


def _scipy() -> Any:
    try:
        import scipy.sparse
    except ImportError:
        raise Unavailable("SciPy is not installed: pip install 'sparsetool[bench]'") from None
    return scipy.sparse


def _as_tensor(y: Any) -> torch.Tensor:
    import torch

    return torch.from_numpy(y).T if not isinstance(y, torch.Tensor) else y.T


def row_bands(indptr: Any, parts: int) -> list[tuple[int, int]]:
    """Split CSR rows into at most ``parts`` contiguous bands of about equal non-zeros.

    >>> import numpy as np
    >>> row_bands(np.array([0, 4, 4, 5, 8]), 2)
    [(0, 1), (1, 4)]
    >>> row_bands(np.array([0, 0, 0]), 3)
    [(0, 2)]
    """
    import numpy as np

    rows, nnz = len(indptr) - 1, int(indptr[-1])
    cuts = np.searchsorted(indptr, [nnz * i / parts for i in range(1, parts)], side="left")
    edges = sorted({0, rows, *(int(min(max(c, 0), rows)) for c in cuts)})
    return [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def cpu_kernel(name: str, weight: torch.Tensor, dtype: torch.dtype, threads: int) -> Kernel:
    """The CPU kernel ``name`` on the masked float32 ``weight`` (M, K), computing in ``dtype``."""
    import torch

    if name == "torch-linear":
        w = weight.to(dtype)
        return Kernel(
            name,
            lambda x: x.to(dtype),
            lambda x: torch.nn.functional.linear(x, w),
            lambda y: y.float(),
        )
    if name == "torch-linear-float32":
        w = weight.to(dtype).float()
        return Kernel(
            name,
            lambda x: x.to(dtype).float(),
            lambda x: torch.nn.functional.linear(x, w),
            lambda y: y,
        )
    values = weight.to(dtype).float()  # the dtype's numbers, held in float32
    if name == "torch-csr":
        import warnings

        with warnings.catch_warnings():  # "support is in beta": said once in the docs instead
            warnings.simplefilter("ignore", UserWarning)
            csr = values.to_sparse_csr()
        return Kernel(
            name,
            lambda x: x.to(dtype).float().T.contiguous(),
            lambda x: torch.sparse.mm(csr, x),
            _as_tensor,
        )
    if name in ("scipy-csr", "scipy-csr-rows"):
        sp = _scipy()
        csr = sp.csr_matrix(values.numpy())
        take = lambda x: x.to(dtype).float().T.contiguous().numpy()  # noqa: E731
        if name == "scipy-csr":
            return Kernel(name, take, lambda x: csr @ x, _as_tensor)
        return _banded(name, csr, threads, take)
    raise Unavailable(f"no CPU kernel named {name}")


def _banded(name: str, csr: Any, threads: int, take: Callable[[torch.Tensor], Any]) -> Kernel:
    """The bands on sparsetool's one thread pool (:func:`sparsetool.util.workers.run`: Ctrl-C
    safe), each writing its rows of the output."""
    import numpy as np

    from sparsetool.util import workers

    bands = [(a, b, csr[a:b]) for a, b in row_bands(csr.indptr, max(1, threads))]
    m = csr.shape[0]

    def run(x: Any) -> Any:
        out = np.empty((m, x.shape[1]), dtype=np.float32)

        def part(band: tuple[int, int, Any]) -> None:
            a, b, piece = band
            out[a:b] = piece @ x

        workers.run(part, bands)
        return out

    return Kernel(name, take, run, _as_tensor)


def cuda_kernel(
    name: str, weight: torch.Tensor, dtype: torch.dtype, device: torch.device, two_four: bool
) -> Kernel:
    """The CUDA kernel ``name`` on ``device``; thin on torch's API (never run on machines
    without CUDA)."""
    import torch

    sync = lambda: torch.cuda.synchronize(device)  # noqa: E731
    back = lambda y: y.float().cpu()  # noqa: E731
    w = weight.to(device=device, dtype=dtype)
    if name == "cublas":
        return Kernel(
            name,
            lambda x: x.to(device=device, dtype=dtype),
            lambda x: torch.nn.functional.linear(x, w),
            back,
            sync,
        )
    if name == "cusparse-csr":
        try:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                csr = w.to_sparse_csr()
        except RuntimeError as e:
            raise Unavailable(f"torch cannot build a CUDA CSR tensor in {dtype}: {e}") from None
        return Kernel(
            name,
            lambda x: x.to(device=device, dtype=dtype).T.contiguous(),
            lambda x: torch.sparse.mm(csr, x),
            lambda y: y.T.float().cpu(),
            sync,
        )
    if name == "semi-structured-2:4":
        if not two_four:
            raise Unavailable("the mask does not keep 2 of every 4 weights along K")
        try:
            ws = torch.sparse.to_sparse_semi_structured(w)
        except (RuntimeError, ValueError, TypeError) as e:
            raise Unavailable(f"torch cannot make this weight 2:4 semi-structured: {e}") from None
        return Kernel(
            name,
            lambda x: x.to(device=device, dtype=dtype),
            lambda x: torch.nn.functional.linear(x, ws),
            back,
            sync,
        )
    raise Unavailable(f"no CUDA kernel named {name}")
