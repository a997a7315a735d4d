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
