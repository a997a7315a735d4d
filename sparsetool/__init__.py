"""sparsetool: tools for unstructured-sparse language models."""

__version__ = "0.1.0"
