"""The errors sparsetool raises on purpose.

Every message names the file or tensor at fault and says what to do next; the CLI prints it as one
``error: ...`` line and exits 1.
"""


class SparsetoolError(Exception):
    """A clean, expected failure (bad input, bad option value). Message is shown to the user."""


class CheckpointError(SparsetoolError):
    """A checkpoint that cannot be read or written as asked (corrupt, truncated, lying header...)."""


class ConfigError(SparsetoolError):
    """An option, preset or config file that does not make sense."""


class ShapeError(CheckpointError):
    """A checkpoint whose model shape cannot be inferred from its tensors.

    The message states what is missing and nothing more: ``flops --checkpoint`` and ``simulate``
    both infer shapes, and each command adds the way out it offers (``missing`` is ``"vocab"``
    when only the vocabulary size is unknown, else None).
    """

    def __init__(self, message: str, *, missing: str | None = None) -> None:
        super().__init__(message)
        self.missing = missing
