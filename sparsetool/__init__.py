"""sparsetool: tools for unstructured-sparse language models.

The Python API (each name is loaded on first use, so ``import sparsetool`` stays light)::

    sparsetool.load(path) -> dict[str, torch.Tensor]   # dense tensors from any sparse encoding
"""

__version__ = "0.1.0"

__all__ = ["__version__", "load"]


def __getattr__(name: str):
    if name == "load":
        from sparsetool.ops.load import load

        return load
    raise AttributeError(f"module 'sparsetool' has no attribute {name!r}")
