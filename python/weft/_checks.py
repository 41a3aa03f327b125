"""Argument checks shared by the Python API: a clear ValueError / TypeError naming the argument,
never a silent truncation (steps=2.7 running 2) or a binding's "incompatible function arguments"."""
from __future__ import annotations

import numbers


def integer(what: str, value, minimum: int = 0) -> int:
    """``value`` as an int: an integral number >= ``minimum`` (bools refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != int(value):
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value!r}")
    if int(value) < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def fraction(what: str, value) -> float:
    """``value`` as a float in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < float(value) <= 1:
        raise ValueError(f"{what} must be a number in (0, 1], got {value!r}")
    return float(value)


def of_type(what: str, value, cls, name: str):
    """``value`` itself when it is a ``cls``, else TypeError naming what was expected."""
    if not isinstance(value, cls):
        raise TypeError(f"{what}: expected {name}, got {type(value).__name__}")
    return value
