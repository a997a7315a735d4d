"""Reading a settings file (TOML, YAML or JSON) into a mapping, with one clean error.

``flops --config``, ``simulate --hardware`` and ``train --config`` all take such files; each
validates the keys itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sparsetool.errors import ConfigError

SUFFIXES = {".toml": "TOML", ".yaml": "YAML", ".yml": "YAML", ".json": "JSON"}


def read_text(path: str | Path, what: str, fix: str) -> str:
    """The text of ``path``; a missing file, a directory or an unreadable file is one
    :class:`ConfigError` naming ``what`` it is meant to be and, for the first two, the ``fix``."""
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{what} '{p}' not found; {fix}") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} '{p}' is a directory; {fix}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(
            f"cannot read {what} '{p}': {getattr(e, 'strerror', None) or e}"
        ) from None


def load_mapping(
    path: str | Path, *, what: str = "config file", default: str = "JSON"
) -> dict[str, Any]:
    """Parse ``path`` by its suffix (``default`` format for any other suffix) into a dict.

    ``what`` names the file in errors ("hardware file", "config file"...). An empty YAML file is
    an empty mapping.

    >>> import tempfile, os
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = os.path.join(d, "x.toml")
    ...     _ = open(p, "w").write("[cs2]\\nfixed_s = 2e-6\\n")
    ...     load_mapping(p)
    {'cs2': {'fixed_s': 2e-06}}
    """
    p = Path(path)
    text = read_text(p, what, "pass an existing TOML, YAML or JSON file")
    kind = SUFFIXES.get(p.suffix.lower(), default)
    try:
        if kind == "TOML":
            import tomllib

            data = tomllib.loads(text)
        elif kind == "YAML":
            import yaml

            data = yaml.safe_load(text)
            data = {} if data is None else data
        else:
            data = json.loads(text)
    except Exception as e:  # each parser raises its own error type; all mean "bad syntax"
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"{what} '{p}' is not valid {kind}: {first}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{what} '{p}' must hold a mapping of keys to values")
    return data
