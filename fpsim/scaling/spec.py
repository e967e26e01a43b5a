"""A loss scaler from what users write (``fpsim.grammar``: ``head:key=value,...``).

- ``None`` or ``"none"``: no scaling (``NoScaler``);
- a number, ``"static:1024"`` or ``"static:scale=1024"``: a static scale;
- ``"dynamic"``: torch's ``GradScaler`` (the ``torch`` preset);
- a preset name (``torch``, ``apex``, ``deepspeed``, ...) with optional overrides of its
  parameters: ``"deepspeed:init_scale=1024,hysteresis=4"``, ``"torch:growth_interval=100"``
  (a value ``none``, ``true`` or ``false`` is that constant, else a number or a word);
- a scaler configuration itself (``NoScaler``, ``StaticScaler``, ``DynamicScaler``).

>>> get_scaler("static:1024").scale
1024.0
>>> get_scaler("torch:growth_interval=100").growth_interval
100
"""
from __future__ import annotations

from ..grammar import number, split_options
from .dynamic import DynamicScaler
from .presets import preset, preset_names
from .static import NoScaler, StaticScaler

__all__ = ["get_scaler", "SCALER_FORMS"]

SCALER_FORMS = ("'none', 'dynamic', 'static:N', or a preset (" + ", ".join(preset_names())
                + ") with optional overrides 'name:key=value,...'")


def get_scaler(spec):
    """The scaler configuration ``spec`` names (see the module docstring); anything else is
    a ``TypeError`` or ``ValueError`` naming what is accepted."""
    if spec is None:
        return NoScaler()
    if isinstance(spec, (NoScaler, StaticScaler, DynamicScaler)) or hasattr(spec, "init"):
        return spec         # a configuration (a user's own has init() and update())
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        return StaticScaler(float(spec))
    if not isinstance(spec, str):
        raise TypeError(f"a scaler is None, a number, a string ({SCALER_FORMS}) or a scaler "
                        f"configuration, got {type(spec).__name__}")
    head, options = split_options(spec, "scaler", positional="scale")
    if head == "none" and not options:
        return NoScaler()
    if head == "static":
        if set(options) != {"scale"}:
            raise ValueError(f"static scale {spec!r}: give the scale, e.g. 'static:1024'")
        return StaticScaler(number(f"scaler {spec!r}", "scale", options["scale"]))
    name = "torch" if head == "dynamic" else head
    if name.replace("_", "-") not in preset_names():
        raise ValueError(f"unknown scaler {spec!r}; use {SCALER_FORMS}")
    if "scale" in options:
        raise ValueError(f"scaler {spec!r}: a preset takes key=value overrides, e.g. "
                         f"'{head}:init_scale=1024'")
    return preset(name, **{key: _value(value) for key, value in options.items()})


def _value(text: str):
    word = text.strip().lower()
    if word in ("none", "true", "false"):
        return {"none": None, "true": True, "false": False}[word]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip()
