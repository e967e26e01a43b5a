"""Loss scaling: none, static and dynamic scalers with skip-on-overflow, and framework presets.

A scaler is a frozen configuration (``NoScaler``, ``StaticScaler``, ``DynamicScaler``);
``scaler.init()`` gives a frozen ``ScalerState``; ``state.update(found_inf)`` gives the next
state, carrying a ``Decision`` that explains the step (skipped? grew? backed off? why?).
``preset(name, **overrides)`` builds the ``DynamicScaler`` that reproduces torch, apex,
DeepSpeed, Megatron, tf-keras, Keras 3 or jmp bit for bit, quirks included (see
``presets``). The numerics around it: ``scale_loss``, ``unscale``, ``found_inf`` and
``check_overflow``.

One training step::

    scaled = scale_loss(loss, state)               # backward of `scaled` gives scaled grads
    overflow = check_overflow(grads, state)        # the framework's test, on scaled grads
    grads = unscale(grads, state)                  # float32(1/float64(scale)) times grads
    state = state.update(overflow)
    if not state.skipped:
        apply(grads)

>>> state = preset("torch", growth_interval=3).init()
>>> for overflow in (True, False, False, False):
...     state = state.update(overflow)
>>> state.scale, state.total_skips, state.decision.action
(65536.0, 1, 'grow')
"""
from .dynamic import PRECISIONS, DynamicScaler, trajectory
from .numerics import check_overflow, found_inf, scale_loss, unscale
from .presets import PRESETS, preset, preset_names
from .spec import SCALER_FORMS, get_scaler
from .state import Decision, LossScaleMinimumError, ScalerState
from .static import NoScaler, StaticScaler

__all__ = [
    "ScalerState", "Decision", "LossScaleMinimumError",
    "DynamicScaler", "StaticScaler", "NoScaler", "PRECISIONS", "trajectory",
    "preset", "PRESETS", "preset_names", "get_scaler", "SCALER_FORMS",
    "scale_loss", "unscale", "found_inf", "check_overflow",
]
