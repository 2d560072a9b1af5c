"""One-line validation of config values: each check raises `ConfigError` naming the field and
the allowed values (`common.config` uses them in every section's `__post_init__`)."""

from __future__ import annotations

import math


class ConfigError(ValueError):
    """A user-facing configuration error; its message is one line naming the field."""


def _choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}: must be one of {', '.join(map(str, allowed))}; got {value!r}")


def _range(name: str, value, lo=None, hi=None, lo_open=False, hi_open=False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ConfigError(f"{name}: must be a number; got {value!r}")
    bad_lo = lo is not None and (value <= lo if lo_open else value < lo)
    bad_hi = hi is not None and (value >= hi if hi_open else value > hi)
    if bad_lo or bad_hi:
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        lo_s = "-inf" if lo is None else lo
        hi_s = "inf" if hi is None else hi
        raise ConfigError(f"{name}: must be in {left}{lo_s}, {hi_s}{right}; got {value!r}")


def _int(name: str, value, lo=None, hi=None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name}: must be an integer; got {value!r}")
    _range(name, value, lo, hi)
