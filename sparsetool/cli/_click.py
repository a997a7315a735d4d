"""The parts of typer's click that the CLI needs and typer does not name publicly, imported here
and nowhere else.

typer vendors click as its private ``typer._click`` (since 0.26; the ``click`` package, if
installed, is another copy whose exceptions typer never raises), and its public API has no usage
error class, no "no such option" error, no current context and no parameter source. So
``pyproject.toml`` pins typer to the tested minor version, and a typer that moves these fails here,
at import, in one place.
"""

from __future__ import annotations

from typer._click.core import ParameterSource
from typer._click.exceptions import NoArgsIsHelpError, NoSuchOption, UsageError
from typer._click.globals import get_current_context

__all__ = [
    "NoArgsIsHelpError",
    "NoSuchOption",
    "ParameterSource",
    "UsageError",
    "get_current_context",
]
