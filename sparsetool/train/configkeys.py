"""A ``train --config`` file's keys and every setting's type: reading a file into
:class:`~sparsetool.train.trainconfig.TrainConfig` keys (sections flattened, dashes, aliases, a
Cerebras Model Zoo ``sparsity:`` block and its spellings) and :func:`check_values`, the one type
check of config files, flags and Python callers; :func:`merge`: defaults < file < flags, then
``config.validate`` (how settings combine).
"""

from __future__ import annotations

import difflib
import math
import numbers
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sparsetool.errors import ConfigError
from sparsetool.train.trainconfig import (
    ALGORITHMS,
    COMMAND_LINE_ONLY,
    DEFAULTS,
    FIELDS,
    FILE_ONLY,
    INIT_METHODS,
    KEY_ALIASES,
    SECTION_EXAMPLE,
    SECTIONS,
    VALUE_ALIASES,
    TrainConfig,
    pretrained_defaults,
    setting,
    validate,
)
from sparsetool.util import options
from sparsetool.util.configfile import load_mapping


def read_config_file(path: str | Path) -> dict:
    """Parse a YAML or TOML file into TrainConfig keys, each value checked against its field's
    type (:func:`check_values`); how the settings combine is :func:`validate`'s."""
    p = Path(path)
    raw = load_mapping(p, what="config file", default="YAML")
    return normalise(raw, f"config file '{p}'")


def normalise(raw: Mapping, where: str) -> dict:
    """Flatten sections, map dashes to underscores, aliases and a Model Zoo ``sparsity:`` block
    to TrainConfig keys, and check every value; an error starts with ``where`` (the file)."""
    flat: dict[str, Any] = {}
    names: dict[str, str] = {}  # key -> how the file spelled it, for messages
    unknown: list[str] = []
    try:
        _flatten(raw, "", flat, names, unknown)
        if unknown:
            raise ConfigError(_unknown_keys(unknown))
        return check_values(flat, names)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def _canonical(key: Any) -> str:
    k = str(key).strip().replace("-", "_")
    return KEY_ALIASES.get(k, k)


def _flatten(raw: Mapping, prefix: str, flat: dict, names: dict, unknown: list) -> None:
    for key, value in raw.items():
        spelled = f"{prefix}{key}"
        k = _canonical(key)
        if k in SECTIONS and isinstance(value, Mapping):
            _flatten(value, f"{spelled}.", flat, names, unknown)
        elif k == "sparsity" and isinstance(value, Mapping) and _is_block(value):
            _sparsity_block(value, f"{spelled}.", flat, names)
        elif k in SECTIONS and k not in FIELDS:
            raise ConfigError(
                f"'{spelled}' is a section: give it keys, e.g. {spelled}: {{{SECTION_EXAMPLE[k]}}}"
            )
        elif k in COMMAND_LINE_ONLY:
            raise ConfigError(
                f"'{spelled}' is a command-line flag, not a config key; give --{k} on "
                "the command line"
            )
        elif k not in FIELDS:
            unknown.append(spelled)
        else:
            _put(flat, names, k, value, spelled)


def _put(flat: dict, names: dict, key: str, value: Any, spelled: str) -> None:
    if key in flat:
        if (
            key == "sparsity_options"
            and isinstance(value, Mapping)
            and isinstance(flat[key], Mapping)
        ):
            both = sorted(set(map(str, value)) & set(map(str, flat[key])))
            if not both:  # the block's extra keys and a sparsity_options mapping: one set
                flat[key] = {**flat[key], **value}
                return
            key, spelled = f"{key}.{both[0]}", f"{spelled}.{both[0]}"
        first = names.get(key, key)
        raise ConfigError(f"'{key}' is given twice (as '{first}' and '{spelled}'); keep one")
    flat[key] = value
    names[key] = spelled


def _unknown_keys(unknown: list[str]) -> str:
    candidates = [*FIELDS, *KEY_ALIASES, *SECTIONS]

    def one(spelled: str) -> str:
        last = spelled.rsplit(".", 1)[-1]
        close = difflib.get_close_matches(_canonical(last), candidates, n=1, cutoff=0.6)
        if not close:
            return f"'{spelled}'"
        guess = close[0].replace("_", "-") if "-" in last else close[0]
        return f"'{spelled}' (did you mean '{guess}'?)"

    if len(unknown) == 1:
        listed = one(unknown[0]).replace(" (did you mean", "; did you mean").rstrip(")")
        head = f"unknown key {listed}"
    else:
        head = f"unknown keys {', '.join(one(k) for k in unknown)}"
    keys = (
        f"he keys are the options of sparsetool train --help (batch-size or batch_size) and "
        f"{', '.join(FILE_ONLY)}; docs/train.md's table of train --config keys lists them all"
    )
    return f"{head} T{keys}" if head.endswith("?") else f"{head}; t{keys}"


def _is_block(d: Mapping) -> bool:
    # A sparsity *schedule* ({type: cubic, init: .., end: ..}) is a value, not a Model Zoo block;
    # older Model Zoo blocks name the algorithm under "type".
    return "algorithm" in d or "type" not in d or str(d["type"]).lower() in ALGORITHMS


# Keys of a Model Zoo ``sparsity:`` block that are TrainConfig settings (the rest are passed to the
# algorithm, as --sparsity-option); the same spellings build_sparsifier reads.
_BLOCK_KEYS = {
    "algorithm": "algorithm",
    "sparsity": "sparsity",
    "init_method": "init_method",
    "distribution": "distribution",
    "drop_fraction": "drop_fraction",
    "initial_sparsity": "initial_sparsity",
    "init_sparsity": "initial_sparsity",
    "param_filter": "param_filter",
    "param_name_patterns": "param_filter",
    "update_freq": "update_freq",
    "freq": "update_freq",
    "update_start": "update_start",
    "start": "update_start",
    "begin": "update_start",
    "update_begin": "update_start",
    "update_stop": "update_stop",
    "stop": "update_stop",
    "end": "update_stop",
    "update_end": "update_stop",
}
_UPDATE_KEYS = {
    "freq": "update_freq",
    "every": "update_freq",
    "start": "update_start",
    "begin": "update_start",
    "begin_step": "update_start",
    "stop": "update_stop",
    "end": "update_stop",
    "end_step": "update_stop",
}


def _sparsity_block(block: Mapping, prefix: str, flat: dict, names: dict) -> None:
    extra: dict[str, Any] = {}
    for key, value in block.items():
        k = _canonical(key)
        spelled = f"{prefix}{key}"
        if k == "type" and str(value).lower() in ALGORITHMS:
            _put(flat, names, "algorithm", value, spelled)
        elif k in ("update", "schedule") and isinstance(value, Mapping):
            for part, v in value.items():
                if str(part) == "type" and str(v).lower() == "periodic":
                    continue
                if str(part) not in _UPDATE_KEYS:
                    raise ConfigError(
                        f"{spelled}: unknown key '{part}'; valid: freq, start, stop (or begin, end)"
                    )
                _put(flat, names, _UPDATE_KEYS[str(part)], v, f"{spelled}.{part}")
        elif k in _BLOCK_KEYS:
            _put(flat, names, _BLOCK_KEYS[k], value, spelled)
        else:
            extra[k] = value
    if extra:
        _put(flat, names, "sparsity_options", extra, f"{prefix}{next(iter(extra))}")


# --- the type of every value, from its TrainConfig field ----------------------------------------

_EXAMPLES = {  # for the settings whose default is no example (None, empty)
    "out": "runs/rigl",
    "preset": "tiny",
    "n_layer": 4,
    "n_head": 4,
    "d_model": 128,
    "context": 128,
    "data": "corpus.txt",
    "algorithm": "rigl",
    "distribution": "erk",
    "init_method": "magnitude",
    "update_freq": 100,
    "update_start": 100,
    "update_stop": 750,
    "drop_fraction": 0.3,
    "initial_sparsity": 0.5,
    "init": "runs/pre/model.safetensors",
    "stop_at": 500,
    "threads": 1,
    "dense": True,
    "distill_from": "models/teacher",
}
# what a value of each type is called: (in "is not ...", in "give ...")
_WHAT = {
    int: ("an integer", "a whole number"),
    float: ("a number", "a number"),
    bool: ("true or false", "true or false"),
    str: ("a string", "text"),
}


def _field_types() -> dict[str, tuple[Any, bool]]:
    """Each TrainConfig field -> (its type: int, float, bool, str, list, tuple, dict or Any;
    whether None is allowed), from the annotations."""
    out = {}
    for name, hint in typing.get_type_hints(TrainConfig).items():
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        args = typing.get_args(hint) if union else (hint,)
        base = next(a for a in args if a is not type(None))
        out[name] = (typing.get_origin(base) or base, type(None) in args or base is Any)
    return out


_TYPES = _field_types()


def _show(value: Any) -> str:
    """A value as a config file writes it: true/false, null, 'text', 3.7."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else repr(value)


class _Value:
    """Checks one value of setting ``key``; ``name`` is how a file spelled it (None: a flag or a
    Python argument, named by its flag)."""

    def __init__(self, key: str, name: str | None) -> None:
        self.key, self.name = key, name
        # how the messages of sparsetool.util.options name it: the flag, or the file's "key:"
        self.label = f"{name}:" if name is not None else setting(key)
        self.short = (name or key).rsplit(".", 1)[-1]  # a file example's key

    def example(self) -> str:
        eg = _EXAMPLES.get(self.key, DEFAULTS.get(self.key))
        shown = _show(eg) if isinstance(eg, bool) else str(eg)
        if self.name is not None or self.key in FILE_ONLY:
            return f"{self.short}: {shown}"
        return f"{setting(self.key)} {shown}"

    def bad(self, value: Any, what: str, give: str) -> ConfigError:
        head = f"{self.name}:" if self.name is not None else setting(self.key)
        return ConfigError(
            f"{head} {_show(value)} is not {what}; give {give}, e.g. {self.example()}"
        )

    def missing(self, give: str) -> ConfigError:
        label = self.name or setting(self.key)
        leave = "drop the key" if self.name is not None else "leave it out"
        return ConfigError(
            f"{label} has no value; give {give}, e.g. {self.example()}, or {leave} for the default"
        )

    def check(self, value: Any) -> Any:
        kind, optional = _TYPES[self.key]
        if value is None:
            if optional:
                return None
            raise self.missing(_WHAT.get(kind, ("", "a value"))[1])
        special = getattr(self, f"_{self.key}", None)
        if special is not None:
            return special(value)
        if kind is int:
            return self.integer(value)
        if kind is float:
            return self.number(value)
        if kind is bool:
            if not isinstance(value, bool):
                raise self.bad(value, *_WHAT[bool])
            return value
        if kind is str:
            if isinstance(value, os.PathLike) and self.key in (
                "out",
                "data",
                "init",
                "distill_from",
            ):
                value = os.fspath(value)
            if not isinstance(value, str):
                raise self.bad(value, *_WHAT[str])
            return value
        return value

    def integer(self, value: Any) -> int:
        x = value
        if isinstance(x, str):
            try:
                x = int(x.strip())  # as --steps reads its text: "12" yes, "1e3" and "3.0" no
            except ValueError:
                raise self.bad(value, *_WHAT[int]) from None
        # typeshed's numbers.Real has no __int__ (int() takes a Real by its __trunc__)
        if (
            isinstance(x, numbers.Real)
            and not isinstance(x, numbers.Integral)
            and math.isfinite(x)
            and x == int(x)  # type: ignore[call-overload]
        ):
            x = int(x)  # type: ignore[call-overload]  # 3.0 is 3 steps; 3.7 is not a step count
        if isinstance(x, bool) or not isinstance(x, numbers.Integral):
            raise self.bad(value, *_WHAT[int])
        return int(x)

    def number(self, value: Any) -> float:
        x = value
        if isinstance(x, str):
            try:
                x = float(x.strip())  # as --lr reads its text: "1e-3" is 0.001
            except ValueError:
                raise self.bad(value, *_WHAT[float]) from None
        if isinstance(x, bool) or not isinstance(x, numbers.Real):
            raise self.bad(value, *_WHAT[float])
        if not math.isfinite(x):
            raise self.bad(value, "a finite number", "a number")
        return float(x)

    # settings whose values are more than one scalar type
    def _sparsity(self, value: Any) -> Any:
        if isinstance(value, Mapping):
            return dict(value)  # a schedule, checked by the algorithm
        return options.parse_sparsity(value, self.label)

    def _drop_fraction(self, value: Any) -> Any:
        if isinstance(value, Mapping):
            return dict(value)  # a schedule, checked by the algorithm
        if isinstance(value, bool) or not isinstance(value, (numbers.Real, str)):
            raise self.bad(value, "a number or a schedule", "a fraction")
        return self.number(value)

    def _init_method(self, value: Any) -> str:
        v = value.strip().lower() if isinstance(value, str) else value
        v = VALUE_ALIASES["init_method"].get(v, v) if isinstance(v, str) else v
        if v not in INIT_METHODS:
            raise self.bad(
                value, "a known init method", "random or magnitude (the Model Zoo's topk)"
            )
        return v

    def _stages(self, value: Any) -> list[tuple[float, float]]:
        if isinstance(value, str):
            value = [value]
        example = f"{self.short}: ['0.9:0.8', '0:0.2']" if self.name is not None else None
        if not isinstance(value, (list, tuple)):
            if self.name is None:
                raise ConfigError(
                    f"--stage {_show(value)}: give SPARSITY:FRACTION stages, e.g. "
                    "--stage 0.9:0.8 --stage 0:0.2"
                )
            raise ConfigError(
                f"{self.name}: {_show(value)} is not a list of SPARSITY:FRACTION "
                f"stages; give e.g. {example}"
            )
        out = []
        for s in value:
            if isinstance(s, (list, tuple)) and len(s) == 2:
                s = f"{s[0]}:{s[1]}"
            out.append(options.parse_stage(str(s), self.label, example))
        return out

    def _sparsity_options(self, value: Any) -> dict:
        if isinstance(value, str):
            value = [value]
        if isinstance(value, (list, tuple)):
            example = (
                f"{self.short}: ['scope=layer'] or {self.short}: {{scope: layer}}"
                if self.name is not None
                else None
            )
            return parse_sparsity_options(value, self.label, example)
        if not isinstance(value, Mapping):
            raise self.bad(value, "a mapping", "KEY: VALUE pairs")
        return {str(k): v for k, v in value.items()}

    def _param_filter(self, value: Any) -> list[str]:
        return list(options.parse_globs(value, self.label))

    def _include(self, value: Any) -> tuple[str, ...]:
        return options.parse_globs(value, self.label)

    _exclude = _include


def parse_sparsity_options(
    items: Any, option: str = "--sparsity-option", example: str | None = None
) -> dict:
    """``["scope=layer", "stop_fraction=0.75"]`` -> ``{"scope": "layer", "stop_fraction": 0.75}``
    (each value read as YAML), as ``--sparsity-option`` and a config file's list give them;
    ``example`` replaces the ``--sparsity-option scope=layer`` a bad item is answered with.

    >>> parse_sparsity_options(["scope=layer", "stop_fraction=0.75"])
    {'scope': 'layer', 'stop_fraction': 0.75}
    """
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        if not isinstance(item, str) or "=" not in item or not item.split("=", 1)[0].strip():
            raise ConfigError(
                f"{option} {item!r} is not KEY=VALUE, e.g. {example or f'{option} scope=layer'}"
            )
        k, v = item.split("=", 1)
        try:
            out[k.strip()] = yaml.safe_load(v)
        except yaml.YAMLError:
            out[k.strip()] = v
    return out


def check_values(values: Mapping[str, Any], names: Mapping[str, str] | None = None) -> dict:
    """Each value checked against (and converted to) the type of its :class:`TrainConfig`
    field: the one type check of config files, flags and Python callers alike. ``names`` gives
    how a file spelled each key (its messages name those); otherwise a message names the flag.

    >>> check_values({"steps": "12", "lr": "1e-3", "threads": 2.0})
    {'steps': 12, 'lr': 0.001, 'threads': 2}
    >>> check_values({"steps": 3.7})
    Traceback (most recent call last):
    ...
    sparsetool.errors.ConfigError: --steps 3.7 is not an integer; give a whole number, e.g. --steps
    1000
    """
    out = {}
    for key, value in values.items():
        if value is None and key in _TYPES and _TYPES[key][0] in (list, tuple, dict):
            continue  # an empty "stages:" or "include:" is none at all
        if key not in _TYPES:
            close = difflib.get_close_matches(key, FIELDS, n=1)
            guess = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"unknown setting {key!r}{guess} (the settings are TrainConfig's fields)"
            )
        out[key] = _Value(key, (names or {}).get(key)).check(value)
    return out


def merge(file_values: dict, flag_values: dict) -> TrainConfig:
    """Defaults, then the config file, then flags that were actually given (not None)."""
    return merge_explained(file_values, flag_values)[0]


def merge_explained(file_values: dict, flag_values: dict) -> tuple[TrainConfig, dict[str, Any]]:
    """:func:`merge`, and the defaults of a pretrained student it applied (with ``--init
    HF_DIR``, :func:`~sparsetool.train.trainconfig.pretrained_defaults`: the settings neither the
    file nor a flag gave that differ from the built-in GPT's)."""
    values = dict(file_values)
    for k, v in flag_values.items():
        if v is None or (k in ("stages", "sparsity_options", "include", "exclude") and not v):
            continue
        if k == "sparsity_options":
            values[k] = {**values.get(k, {}), **v}
        else:
            values[k] = v
    values = check_values(values)
    applied = pretrained_defaults(values)
    return validate(TrainConfig.from_dict({**values, **applied})), applied
