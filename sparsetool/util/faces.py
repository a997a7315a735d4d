"""One declaration per option: a command's options record is a frozen dataclass whose fields hold
each option's default and, in their metadata, how it shows on the command line (its
:class:`OptionFace`). The CLI builds its typer options from the faces, the Python API takes its
defaults from the fields, and a run's provenance records the fields: three faces, one place.

Declare a field with :func:`option` and give the record :class:`OptionsRecord`'s class methods::

    @dataclass(frozen=True)
    class MyOptions(OptionsRecord):
        command = "mine"
        seq: int = option(512, "--seq", "Tokens per window.", metavar="N", parse=check_count)

    MyOptions.face("seq")   # (512, OptionFace("--seq", "Tokens per window.", "N", check_count))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

__all__ = ["OptionFace", "OptionsRecord", "option"]


@dataclass(frozen=True)
class OptionFace:
    """How one option shows on the command line: ``flag`` (``--owl-m``), its ``help``, its
    ``metavar``, and ``parse``, the check of :mod:`sparsetool.util.options` the CLI runs on it
    while parsing (called as ``parse(value, flag, **limits)``), if any."""

    flag: str
    help: str = ""
    metavar: str | None = None
    parse: Callable[..., Any] | None = None
    limits: Mapping[str, Any] = field(default_factory=dict)


def option(
    default: Any,
    flag: str,
    help: str = "",
    *,
    metavar: str | None = None,
    parse: Callable[..., Any] | None = None,
    **limits: Any,
) -> Any:
    """A field of an options record: its default, and its :class:`OptionFace` as metadata."""
    return field(default=default, metadata={"face": OptionFace(flag, help, metavar, parse, limits)})


class OptionsRecord:
    """The class methods an options dataclass shares: look up a field's default and face, every
    default, and the entries of a mapping that name options. ``command`` names the command in
    messages."""

    command: ClassVar[str] = "this command"

    @classmethod
    def face(cls, name: str) -> tuple[Any, OptionFace]:
        """Option ``name``'s default and how it shows on the command line."""
        for f in fields(cls):  # type: ignore[arg-type]  # a dataclass subclass
            if f.name == name:
                assert f.default is not MISSING, name
                return f.default, f.metadata["face"]
        raise KeyError(f"not an option of {cls.command}: {name}")

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every option's default, by field name."""
        return {f.name: f.default for f in fields(cls)}  # type: ignore[arg-type]

    @classmethod
    def given(cls, values: Mapping[str, Any]) -> dict[str, Any]:
        """``values`` by option name, each choice given as an ``Enum`` turned into its name; a
        name that is no option is a TypeError, as a wrong keyword of a function is."""
        unknown = sorted(set(values) - set(cls.pick(values)))
        if unknown:
            raise TypeError(f"not an option of {cls.command}: {', '.join(unknown)}")
        return {k: getattr(x, "value", x) for k, x in values.items()}

    @classmethod
    def pick(cls, values: Mapping[str, Any]) -> dict[str, Any]:
        """The entries of ``values`` that name an option (a caller's locals, say)."""
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        return {k: v for k, v in values.items() if k in names}
