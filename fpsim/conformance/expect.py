"""Check the settings a trace records against the settings that were intended.

A replay applies the trace header's ``params`` (the real scaler's configuration) to the
preset, so a scaler configured wrongly -- ``growth_interval=7`` where 2000 was meant -- agrees
with itself step by step. ``check_settings`` compares the recorded settings with what was
intended: explicit values (``fpsim check-scaler --expect growth_interval=2000``) and/or a
preset's documented defaults (``--expect-preset torch``), and returns one line per setting
that differs or that the header does not record (an empty list: all as intended).

Backoff factors are compared by meaning: torch and Megatron multiply the scale by 0.5,
DeepSpeed, apex, Keras and jmp divide it by 2.0, so a recorded 0.5 meets a dividing preset's
2.0 (both conventions are shown where they differ).

>>> check_settings({"growth_interval": 7, "init_scale": 65536.0}, preset="torch")
['MISCONFIGURED: the trace header records growth_interval=7, expected 2000 (preset torch)']
>>> check_settings({"backoff_factor": 0.5}, preset="deepspeed")
[]
"""
from __future__ import annotations

from ..scaling import preset as make_preset

__all__ = ["check_settings", "preset_settings", "backoff_conventions"]

_NOT_SETTINGS = ("name", "source")


def preset_settings(name: str) -> dict:
    """Preset ``name``'s documented defaults, in ``DynamicScaler`` field names."""
    scaler = make_preset(name)
    return {key: getattr(scaler, key) for key in scaler.field_names()
            if key not in _NOT_SETTINGS}


def backoff_conventions(factor: float, op: str) -> str:
    """A backoff in both conventions: ``"scale / 2.0 = scale x 0.5"``."""
    if op == "divide":
        return f"scale / {factor!r} = scale x {1 / factor!r}"
    return f"scale x {factor!r} = scale / {1 / factor!r}"


def check_settings(recorded: dict, expected: dict | None = None, *,
                   preset: str | None = None) -> list[str]:
    """The recorded settings (a trace header's ``params``) that differ from ``expected``
    (explicit values, which must be recorded) or from ``preset``'s defaults (compared where
    recorded; a header that records none of them is reported too)."""
    if not isinstance(recorded, dict):
        raise TypeError(f"recorded must be a dict of settings, got {type(recorded).__name__}")
    wanted = {key: (value, "--expect") for key, value in (expected or {}).items()}
    problems = [f"MISCONFIGURED: the trace header does not record {key} (expected "
                f"{_shown(key, value)}): the setting cannot be confirmed"
                for key, (value, _) in wanted.items() if key not in recorded]
    if preset is not None:
        defaults = preset_settings(preset)
        compared = [key for key in recorded if key in defaults and key not in wanted]
        if not compared and not wanted:
            problems.append(f"MISCONFIGURED: the trace header records no settings to check "
                            f"against preset {preset}")
        wanted.update((key, (defaults[key], f"preset {preset}")) for key in compared)
    for key, (value, origin) in wanted.items():
        if key in recorded and not _same_setting(key, recorded[key], value):
            problems.append(f"MISCONFIGURED: the trace header records "
                            f"{_shown(key, recorded[key])}, expected "
                            f"{_shown(key, value).partition('=')[2]} ({origin})")
    return problems


def _same_setting(key: str, recorded, wanted) -> bool:
    if isinstance(recorded, (bool, str)) or isinstance(wanted, (bool, str)) \
            or recorded is None or wanted is None:
        return type(recorded) is type(wanted) and recorded == wanted
    if key == "backoff_factor" and recorded > 0 and wanted > 0:
        # a multiplier (torch's 0.5) and a divisor (DeepSpeed's 2.0) mean the same backoff
        return _multiplier(recorded) == _multiplier(wanted)
    return float(recorded) == float(wanted)


def _multiplier(factor) -> float:
    return float(factor) if factor < 1 else 1 / factor


def _shown(key: str, value) -> str:
    if key == "backoff_factor" and isinstance(value, (int, float)) \
            and not isinstance(value, bool) and value > 0 and value != 1:
        op = "multiply" if value < 1 else "divide"
        return f"backoff_factor={value!r} ({backoff_conventions(float(value), op)})"
    return f"{key}={value!r}"
