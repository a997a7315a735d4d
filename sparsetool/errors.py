"""The errors sparsetool raises on purpose.

Every message names the file or tensor at fault and says what to do next; the CLI prints it as one
``error: ...`` line and exits 1 (:class:`UsageError`: 2; :class:`Interrupted`: 128 + the signal's
number).
"""


class SparsetoolError(Exception):
    """A clean, expected failure (bad input, bad option value). Message is shown to the user.

    ``reclaimed``: the temporaries of killed runs removed before the failure (a list of
    ``sparsetool.checkpoint.output_files.Reclaimed``, set by its ``reclaiming`` block; a
    KeyboardInterrupt that ends the work carries the same attribute)."""

    reclaimed: tuple[object, ...] = ()


class Interrupted(SparsetoolError):
    """Work stopped by Ctrl-C or a signal; ``exit_code`` is 128 + the signal's number (130 for
    SIGINT, 143 for SIGTERM), what a shell reports for a process the signal ended."""

    def __init__(self, message: str, *, exit_code: int = 130) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class CheckpointError(SparsetoolError):
    """A checkpoint that cannot be read or written as asked (corrupt, truncated, lying
    header...)."""


class ConfigError(SparsetoolError):
    """An option, preset or config file that does not make sense."""


class UsageError(ConfigError):
    """An option that does not fit the input it is given with, found only once that input is read
    (``eval --stride`` longer than the model's window, ``train --init HF_DIR --n-layer 4``): a
    usage error like those found while the command line is parsed, so the CLI exits 2."""

    exit_code = 2


class ShapeError(CheckpointError):
    """A checkpoint whose model shape cannot be inferred from its tensors.

    The message states what is missing and nothing more: ``flops --checkpoint`` and ``simulate``
    both infer shapes, and each command adds the way out it offers (``missing`` is ``"vocab"``
    when only the vocabulary size is unknown, else None).
    """

    def __init__(self, message: str, *, missing: str | None = None) -> None:
        super().__init__(message)
        self.missing = missing
