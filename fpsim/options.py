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
>>> check_choice("rounding mode", "nearest_evn", ("nearest_even", "toward_zero"))
Traceback (most recent call last):
ValueError: unknown rounding mode 'nearest_evn'; did you mean 'nearest_even'? accepted:
nearest_even, toward_zero
>>> check_count("hidden size", 8.9, 1)
Traceback (most recent call last):
TypeError: hidden size must be a positive integer, got 8.9
"""
from __future__ import annotations

import difflib
import math
import os
import struct
from numbers import Integral, Real
from pathlib import Path

__all__ = ["check_choice", "check_flag", "check_count", "check_real", "check_between",
           "check_instance", "check_path", "described"]


def check_choice(what: str, value, choices: tuple):
    """``value`` if it is one of ``choices`` (strings), else an error naming them."""
    if not isinstance(value, str) or value not in choices:
        error = ValueError if isinstance(value, str) else TypeError
        raise error(f"unknown {what} {value!r};{suggestion(value, choices)} accepted: "
                    f"{', '.join(choices)}")
    return value


def suggestion(value, choices) -> str:
    """`` did you mean 'x'?`` for the choice closest to a mistyped string, else ''."""
    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value, [getattr(c, "value", c) for c in choices], 1, 0.6)
    return f" did you mean {close[0]!r}?" if close else ""


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
    if not low <= int(value) <= high:
        raise ValueError(f"{name} must be {wanted}, got {value!r}")
    return int(value)


__all__ += ["check_float32", "suggestion"]


def check_float32(name: str, value, low: float = -math.inf, high: float = math.inf, *,
                  low_open: bool = False, high_open: bool = False) -> float:
    """A real number (not a bool) in [low, high] (an end open with ``low_open`` /
    ``high_open``) both as given and as float32 holds it, as a Python float (as given).
    Learning rates, scales and the like are used in float32 or a narrower format, where 1e-50
    is 0 and 1e39 is inf (float32's range is 2**-149 .. 3.4e38), so a value that is allowed
    but becomes one that is not is refused too.

    >>> check_float32("lr", 1e-50, 0.0, low_open=True)
    Traceback (most recent call last):
    ValueError: lr=1e-50 is 0.0 in float32, the format it is used in; give a value in (0.0, inf)
    that float32 keeps there (its range is 2**-149 to 3.4e38)
    >>> check_float32("beta1", "0.9", 0.0, 1.0, high_open=True)
    Traceback (most recent call last):
    TypeError: beta1 must be a number in [0.0, 1.0), got '0.9'
    """
    closing = ")" if high_open or high == math.inf else "]"
    interval = f"{'(' if low_open else '['}{low}, {high}{closing}"

    def outside(number: float) -> bool:
        return (not math.isfinite(number) or number < low or number > high
                or (low_open and number == low) or (high_open and number == high))

    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number in {interval}, got {value!r}")
    number = _as_float(value)
    if outside(number):
        raise ValueError(f"{name} must be a number in {interval}, got {value!r}")
    stored = _in_float32(number)
    if outside(stored):
        raise ValueError(f"{name}={value!r} is {stored!r} in float32, the format it is used "
                         f"in; give a value in {interval} that float32 keeps there (its range "
                         f"is 2**-149 to 3.4e38)")
    return number


def _as_float(value) -> float:
    """``float(value)``, with a number too large for a float (10**400) as infinity."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _in_float32(number: float) -> float:
    """``number`` rounded to float32 (nearest, ties to even; beyond its range, infinity)."""
    try:
        return struct.unpack("f", struct.pack("f", number))[0]
    except OverflowError:
        return math.copysign(math.inf, number)
