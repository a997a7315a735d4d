"""Sparse-training algorithms for ``sparsetool train``: a name -> class registry and
:func:`build_sparsifier`, which reads a config mapping (sparsetool's own keys or the Cerebras Model
Zoo ``sparsity:`` block).

>>> build_sparsifier({"algorithm": "rigl", "sparsity": 0.8, "update": {"freq": 50, "stop": 750}})
RigL(sparsity_level=0.8, init_method='random', distribution='uniform', seed=0, param_filter=None,
update_freq=50, update_start=None, update_stop=750, densified=False, total_steps=0, updates_done=0,
drop_fraction=0.3, stop_fraction=0.75)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sparsetool.errors import ConfigError
from sparsetool.train.algorithms.base import Sparsifier
from sparsetool.train.algorithms.gmp import GMP
from sparsetool.train.algorithms.granet import GraNet
from sparsetool.train.algorithms.imp import IMP
from sparsetool.train.algorithms.rigl import RigL
from sparsetool.train.algorithms.set import SET
from sparsetool.train.algorithms.static import Static
from sparsetool.train.schedules import Periodic

__all__ = [
    "ALGORITHMS",
    "GMP",
    "IMP",
    "SET",
    "GraNet",
    "RigL",
    "Sparsifier",
    "Static",
    "build_sparsifier",
]

ALGORITHMS: dict[str, type[Sparsifier]] = {
    "static": Static,
    "gmp": GMP,
    "set": SET,
    "rigl": RigL,
    "granet": GraNet,
    "imp": IMP,
}

# Other spellings of config keys (flat update keys, Model Zoo names) -> canonical key.
_ALIASES = {
    "type": "algorithm",
    "init_sparsity": "initial_sparsity",
    "schedule": "update",
    "freq": "update_freq",
    "begin": "update_start",
    "start": "update_start",
    "update_begin": "update_start",
    "end": "update_stop",
    "stop": "update_stop",
    "update_end": "update_stop",
}
_UPDATE_KEYS = {
    "freq": "update_freq",
    "start": "update_start",
    "begin": "update_start",
    "stop": "update_stop",
    "end": "update_stop",
    "every": "update_freq",
    "begin_step": "update_start",
    "end_step": "update_stop",
}
_FIELDS = {"sparsity": "sparsity_level"}


def _valid_keys(cls: type[Sparsifier]) -> list[str]:
    keys = ["algorithm", *cls.KEYS]
    if "update_freq" in cls.KEYS:
        keys.append("update")
    return sorted(keys)


def build_sparsifier(config: Mapping[str, Any] | Sparsifier) -> Sparsifier:
    """A sparsifier from a config mapping.

    Keys: ``algorithm`` (static, gmp, set, rigl, granet, imp; default static, as a Model Zoo
    block without one), ``sparsity`` (number or schedule), ``init_method`` (random, magnitude),
    ``distribution`` (uniform, erk), ``update: {freq, start, stop}`` (or flat ``update_freq``,
    ``begin``/``start``, ``end``/``stop``; Model Zoo's older ``schedule``), ``drop_fraction``,
    ``initial_sparsity``, ``seed``, ``param_filter`` (globs), ``stop_fraction`` (set, rigl,
    granet), ``scope`` (granet: global or layer), and for imp ``fraction``, ``period``,
    ``rewind_step``, ``rounds``. A key the chosen algorithm does not use is an error, which lists
    the valid ones.
    """
    if isinstance(config, Sparsifier):
        return config
    if not isinstance(config, Mapping):
        raise ConfigError(
            f"sparsity config must be a mapping of keys to values, got {type(config).__name__}"
        )
    cfg: dict[str, Any] = {}
    for key, value in config.items():
        canon = _ALIASES.get(str(key), str(key))
        if canon in cfg:
            raise ConfigError(f"sparsity config: {key!r} is given twice (under another spelling)")
        cfg[canon] = value
    algorithm = str(cfg.pop("algorithm", "static")).lower()
    if algorithm not in ALGORITHMS:
        raise ConfigError(
            f"sparsity config: unknown algorithm {algorithm!r}; valid: {', '.join(ALGORITHMS)}"
        )
    cls = ALGORITHMS[algorithm]
    if "update" in cfg:
        update = cfg.pop("update")
        if "update_freq" not in cls.KEYS:
            raise ConfigError(
                f"sparsity config: {algorithm} has no mask updates, so 'update' does not apply; "
                f"valid keys: {', '.join(_valid_keys(cls))}"
            )
        if isinstance(update, Periodic):
            update = {"freq": update.every, "start": update.begin_step, "stop": update.end_step}
        if not isinstance(update, Mapping):
            raise ConfigError("sparsity config: 'update' must be a mapping {freq, start, stop}")
        for key, value in update.items():
            if key == "type" and str(value).lower() == "periodic":
                continue
            if key not in _UPDATE_KEYS:
                raise ConfigError(
                    f"sparsity config: unknown key {key!r} in 'update'; valid: freq, start, stop"
                )
            if _UPDATE_KEYS[key] in cfg:
                raise ConfigError(f"sparsity config: update {key!r} is given twice")
            if value is not None:
                cfg[_UPDATE_KEYS[key]] = value
    kwargs: dict[str, Any] = {}
    for key, value in cfg.items():
        if key not in cls.KEYS:
            raise ConfigError(
                f"sparsity config: key {key!r} is not used by algorithm {algorithm!r}; "
                f"valid keys: {', '.join(_valid_keys(cls))}"
            )
        if key == "seed" and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"sparsity config: seed must be an integer, got {value!r}")
        if key == "param_filter" and not (
            isinstance(value, str)
            or (isinstance(value, (list, tuple)) and all(isinstance(g, str) for g in value))
        ):
            raise ConfigError("sparsity config: param_filter must be a glob or a list of globs")
        kwargs[_FIELDS.get(key, key)] = value
    return cls(**kwargs)
