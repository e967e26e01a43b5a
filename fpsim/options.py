"""One validation vocabulary for options: each check takes the option's name and value and
either returns the value as it will be used or raises with one sentence that says what was
wrong and what is accepted: a TypeError for a value of the wrong type, a ValueError for one
of the right type outside what is accepted. Python's coercions are refused on purpose:
``int(8.9)`` is 8, ``bool('no')`` is True, so 8.9, '8' and 'yes' are errors here, not sizes
and flags.

>>> check_choice("rounding mode", "nearest_even", ("nearest_even", "toward_zero"))
'nearest_even'
>>> check_choice("rounding mode", "sideways", ("nearest_even", "toward_zero"))
Traceback (most recent call last):
ValueError: unknown rounding mode 'sideways'; accepted: nearest_even, toward_zero
>>> check_count("hidden size", 8.9, 1)
Traceback (most recent call last):
TypeError: hidden size must be a positive integer, got 8.9
"""
from __future__ import annotations

import math
import os
from numbers import Integral, Real
from pathlib import Path

__all__ = ["check_choice", "check_flag", "check_count", "check_real", "check_between",
           "check_instance", "check_path", "described"]


def check_choice(what: str, value, choices: tuple):
    """``value`` if it is one of ``choices`` (strings), else an error naming them."""
    if not isinstance(value, str) or value not in choices:
        error = ValueError if isinstance(value, str) else TypeError
        raise error(f"unknown {what} {value!r}; accepted: {', '.join(choices)}")
    return value


def check_flag(name: str, value) -> bool:
    """True or False (NumPy's bool too); anything Python would read as a truth is refused."""
    numpy_bool = getattr(value, "shape", None) == () and str(getattr(value, "dtype", "")) == "bool"
    if not (isinstance(value, bool) or numpy_bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_count(name: str, value, low: int = 0) -> int:
    """An integer >= ``low`` (NumPy's integers too; not a bool, not 8.9, not '8')."""
    wanted = "a positive integer" if low == 1 else f"an integer >= {low}"
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be {wanted}, got {value!r}")
    if value < low:
        raise ValueError(f"{name} must be {wanted}, got {value!r}")
    return int(value)


def check_real(name: str, value, what: str = "a finite number") -> float:
    """A finite real number (NumPy's too; not a bool), as a Python float."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number ({what}), got "
                        f"{type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite ({what}), got {value!r}")
    return float(value)


def check_between(name: str, value, low: float, high: float = math.inf, *,
                  low_open: bool = False) -> float:
    """A finite real number in [low, high] ((low, high] with ``low_open``), as a float."""
    interval = (f"{'(' if low_open else '['}{low:g}, {high:g}]" if high != math.inf else
                f"{'>' if low_open else '>='} {low:g}")
    wanted = f"a number {'in ' if high != math.inf else ''}{interval}"
    number = check_real(name, value, wanted)
    if number < low or number > high or (low_open and number == low):
        raise ValueError(f"{name} must be {wanted}, got {value!r}")
    return number


def check_instance(name: str, value, types, wanted: str):
    """``value`` if it is an instance of ``types``, else a TypeError saying ``wanted``; a bool
    only where ``types`` names bool (to Python True is the integer 1)."""
    named = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in named):
        raise TypeError(f"{name} must be {wanted}, got {described(value)}")
    return value


def check_path(name: str, value) -> Path:
    """A file or folder name (a str or an os.PathLike, not blank) as a ``Path``."""
    check_instance(name, value, (str, os.PathLike), "a file or folder name (a str or an "
                                                     "os.PathLike)")
    if not str(os.fspath(value)).strip():
        raise ValueError(f"{name} must be a file or folder name, got the empty name "
                         f"{value!r}")
    return Path(value)


def described(value, limit: int = 60) -> str:
    """``value`` as an error message shows it: its type and a repr cut at ``limit``
    characters (a class is named as one: ``SGD`` where ``SGD(lr=0.1)`` was meant)."""
    if isinstance(value, type):
        return f"the class {value.__name__}"
    shown = repr(value)
    shown = shown if len(shown) <= limit else shown[:limit - 3] + "..."
    return f"{type(value).__name__} {shown}"


__all__ += ["check_count_between"]


def check_count_between(name: str, value, low: int, high: int) -> int:
    """An integer from ``low`` to ``high`` (as ``check_count``, bounded above too)."""
    wanted = f"an integer from {low} to {high}"
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be {wanted}, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be {wanted}, got {value!r}")
    return int(value)
