"""Named presets: each framework's dynamic loss scaler as a ``DynamicScaler``, quirks included.

``preset(name, **overrides)`` returns the configuration; ``.init()`` starts it. Each builder's
docstring cites the source it follows (file and function) and lists the quirks it encodes;
``PRESETS[name].__doc__`` shows it, and ``scaler.source`` carries the citation.

=========  ==========  =====  =========  ===========  ========  ==========  ===========
preset     init        grow   interval   backoff      floor     hysteresis  scale held
=========  ==========  =====  =========  ===========  ========  ==========  ===========
torch      2**16       x2     2000       x0.5         none      1           fp32 (f64 op)
apex       2**16       x2     2000       /2           optional  1           Python float
deepspeed  2**16       x2     1000 (+1)  /2           1, raise  2           Python float
megatron   2**32       x2     1000       x0.5         1         2 (growth)  fp32
tf-keras   2**15       x2     2000 (>=)  /2           1         1           fp32
keras3     2**15       x2     2000       /2           none      1           fp32
jmp        2**15       x2     2000 (%)   /2           1         1           fp32
=========  ==========  =====  =========  ===========  ========  ==========  ===========

>>> scaler = preset("deepspeed")
>>> scaler.growth_interval, scaler.tracker_start, scaler.hysteresis, scaler.min_scale
(1000, -1, 2, 1.0)
>>> preset("torch", growth_interval=100).growth_interval
100
"""
from __future__ import annotations

from .dynamic import DynamicScaler

__all__ = ["preset", "PRESETS", "preset_names"]


def _torch(**kw) -> DynamicScaler:
    """PyTorch ``torch.amp.GradScaler`` (``"cuda"`` and ``"cpu"`` alike). Checked against torch
    2.13.0: the real ``GradScaler("cpu")`` in ``tests/test_conformance_torch.py``.

    Sources: ``torch/amp/grad_scaler.py`` (``GradScaler.__init__``, ``_lazy_init_scale_
    growth_tracker``, ``unscale_``, ``update``) and ``aten/src/ATen/native/cpu/
    AmpGradScalerKernels.cpp`` (``_amp_update_scale_cpu_kernel``,
    ``_amp_foreach_non_finite_check_and_unscale_cpu_kernel``; the CUDA kernel in
    ``aten/src/ATen/native/cuda/AmpKernels.cu`` has the same arithmetic).

    - The scale is a float32 tensor made by ``torch.full((), init_scale, float32)``: the
      initial scale is rounded to float32 (a value that overflows float32 raises there).
    - ``growth_tracker`` is an int32 tensor starting at 0. On a clean step the kernel computes
      ``successful = tracker + 1``; if ``successful == growth_interval`` it grows and resets
      the tracker to 0, else stores ``successful``. Equality, not ``>=``: a tracker already
      past the interval (``set_growth_interval`` lowered below it) never grows again until an
      overflow resets it.
    - Growth: ``static_cast<float>(scale * growth_factor)`` -- the float32 scale times the
      double factor, in double, rounded once to float32 -- kept only if finite, so the scale
      stops at the largest power of two below the float32 limit (2**127 with factor 2); the
      tracker is reset even when the growth is refused.
    - Backoff: ``scale * backoff_factor`` in double, stored as float32; no floor and no guard,
      so repeated overflows walk the scale through the float32 subnormals to 0
      (2**-149 * 0.5 rounds to 0). At 0 it stays 0 (0 * growth is finite).
    - Overflow: ``found_inf`` is set when any *scaled* gradient is inf/NaN, before the
      multiplication by ``inv_scale = scale.double().reciprocal().float()``; ``update``
      treats any non-zero ``found_inf`` (even NaN) as an overflow; ``step`` skips the
      optimizer step on it.
    - ``GradScaler.__init__`` refuses ``growth_factor <= 1`` and ``backoff_factor >= 1``
      but checks nothing else (a negative backoff factor is accepted there; not here).
    """
    return DynamicScaler(**{**dict(
        init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, backoff_op="multiply",
        growth_interval=2000, precision="float64_to_float32", growth_compare="eq",
        tracker_start=0, finite_guard=True, name="torch",
        source="torch/amp/grad_scaler.py GradScaler.update; aten/src/ATen/native/cpu/"
               "AmpGradScalerKernels.cpp _amp_update_scale_cpu_kernel"), **kw})


def _apex(**kw) -> DynamicScaler:
    """NVIDIA apex ``apex.amp`` ``LossScaler`` (``loss_scale="dynamic"``). Follows apex's
    source; not run against a real apex by fpsim's tests.

    Source: ``apex/amp/scaler.py`` (``LossScaler.__init__``, ``LossScaler.update_scale``,
    ``LossScaler.unscale``) and ``csrc/multi_tensor_scale_kernel.cu`` (``ScaleFunctor``).

    - The scale is a Python float (``init_scale=2.**16``); ``max_loss_scale=2.**24``,
      ``min_loss_scale=None``, ``scale_window=2000``; the factor is fixed at 2
      (``scale_factor`` is accepted by ``__init__`` but ``update_scale`` writes ``/2.`` and
      ``*2.``).
    - Overflow: ``should_skip``; ``_loss_scale = max(min, scale/2.)`` when a minimum is set
      (``if(self._min_loss_scale)``: a minimum of 0 counts as none), else ``scale/2.``;
      ``_unskipped = 0``. Clean: ``_unskipped += 1``. Then, in both cases, if
      ``_unskipped == scale_window``: ``scale = min(max_loss_scale, scale*2.)`` and
      ``_unskipped = 0`` -- growth at the 2000th clean step, capped, no finiteness test
      (the cap makes it moot).
    - Without a minimum the Python float halves down to 5e-324 and then 0.0, after which
      ``unscale``'s ``1./scale`` raises ZeroDivisionError in apex (here ``inv_scale`` is inf).
    - Unscaling multiplies by ``1./scale`` passed to the fused kernel as a C ``float``:
      ``float32(1/float64(scale))`` in float32, as torch. The fused kernel tests the
      *incoming* (scaled) gradients with ``isfinite``; the Python fallback
      ``scale_check_overflow_python`` tests ``float(model_grad.float().sum())`` instead
      (``overflow_check="sum"``).
    """
    return DynamicScaler(**{**dict(
        init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=2.0, backoff_op="divide",
        growth_interval=2000, precision="float64", growth_compare="eq", tracker_start=0,
        finite_guard=False, min_scale=None, max_scale=2.0 ** 24, name="apex",
        source="apex/amp/scaler.py LossScaler.update_scale"), **kw})


def _deepspeed(**kw) -> DynamicScaler:
    """DeepSpeed's ``DynamicLossScaler`` with the fp16 config defaults: the scaler of the
    ZeRO stage 1-3 optimizers. Checked against DeepSpeed 0.19.6: its source, and the real
    ``DynamicLossScaler`` run on CPU over the standard overflow patterns
    (``tests/test_conformance_deepspeed_megatron.py``). The non-ZeRO fp16
    optimizers (``FP16_Optimizer``, ``FP16_UnfusedOptimizer``) update their scale without
    hysteresis and never raise: preset ``deepspeed-fp16``.

    Sources: ``deepspeed/runtime/fp16/loss_scaler.py`` (``DynamicLossScaler.__init__``,
    ``DynamicLossScaler.update_scale``), ``deepspeed/runtime/utils.py`` (``has_inf_or_nan``),
    ``deepspeed/runtime/zero/stage_1_and_2.py`` (``has_overflow``) and
    ``deepspeed/runtime/constants.py`` (``FP16_INITIAL_SCALE_POWER_DEFAULT = 16``,
    ``FP16_LOSS_SCALE_WINDOW_DEFAULT = 1000``, ``FP16_HYSTERESIS_DEFAULT = 2``,
    ``FP16_MIN_LOSS_SCALE_DEFAULT = 1``, ``consecutive_hysteresis`` False).

    - The scale is a Python number (``2**initial_scale_power``); ``scale_factor = 2.0``.
    - Clean step: ``stable_interval = (cur_iter - last_overflow_iter) - 1``; grow
      (``cur_scale *= 2.0``, no ceiling, no finiteness test) when ``stable_interval > 0``
      and ``stable_interval % scale_window == 0``. With ``last_overflow_iter = -1`` at the
      start and set to the overflowing iteration after each overflow, the first growth comes
      after ``scale_window + 1`` clean steps and then every ``scale_window``: the tracker
      here starts at -1 (``tracker_start=-1``) and is set to -1 by every overflow.
    - Hysteresis (``delayed_shift=2``): an overflow with ``cur_hysteresis > 1`` only
      decrements it; at 1 the scale backs off to ``max(cur_scale / 2.0, min_scale)`` and the
      counter stays 1. It is refilled only when the scale grows (``consecutive_hysteresis``
      False; with True it is refilled by every clean step: ``hysteresis_refill="clean"``).
      Every overflow, absorbed or not, sets ``last_overflow_iter`` (resets the tracker).
    - A backoff due while ``cur_scale == min_scale`` raises ``Exception("Current loss scale
      already at minimum - cannot decrease scale anymore. Exiting run.")``
      (``raise_error_at_min_scale=True``): here ``LossScaleMinimumError``.
    - ``found_inf`` (DeepSpeed 0.19.6 as released on PyPI): every overflow test calls
      ``deepspeed/runtime/utils.py`` ``has_inf_or_nan(x)``, which is
      ``not (isfinite(x.amax()) and isfinite(x.amin()))`` (an empty tensor: no overflow) --
      ZeRO 1-2's ``_has_inf_or_nan`` (``has_overflow_partitioned_grads_serial``, and the
      CPU-offload tracker), ZeRO 3's serial path (its partitioned path tests
      ``isinf(...).any()`` and ``isnan(...).any()``: the same answer), and
      ``CheckOverflow._has_inf_or_nan`` of the non-ZeRO optimizers. ``amax``
      carries a NaN and ``+inf`` through, ``amin`` a ``-inf``, so it flags exactly the
      gradients with an inf or NaN element: ``overflow_check="nonfinite"``. Releases up to
      0.19.5 (tags 0.3.0 to 0.19.5 read) had ``CheckOverflow`` test
      ``float(x.float().sum())`` instead, which also flags finite float32 gradients whose sum
      overflows: ``overflow_check="sum"`` reproduces that. ZeRO 1-2 summed the same way in
      0.12.0 and tested elements (``isnan``/``isinf``) from 0.16.0 to 0.19.5. Unscaling
      multiplies by ``1. / cur_scale``.
    - Not modelled: the rank-0 log line formats ``int(self.cur_scale)``, which raises
      OverflowError at the first overflow once the unbounded scale has grown to inf (after
      ~1000 growths); the real scaler does, and the test pins it.
    """
    return DynamicScaler(**{**dict(
        init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=2.0, backoff_op="divide",
        growth_interval=1000, precision="float64", growth_compare="eq", tracker_start=-1,
        finite_guard=False, min_scale=1.0, hysteresis=2, hysteresis_refill="growth",
        hysteresis_decrement_on_backoff=False, raise_at_min=True,
        overflow_check="nonfinite", name="deepspeed",
        source="deepspeed/runtime/fp16/loss_scaler.py DynamicLossScaler.update_scale"), **kw})


def _deepspeed_fp16(**kw) -> DynamicScaler:
    """DeepSpeed's non-ZeRO fp16 optimizers, ``FP16_Optimizer`` (fused) and
    ``FP16_UnfusedOptimizer``, which scale with their own ``_update_scale``, not
    ``DynamicLossScaler``. Checked against DeepSpeed 0.19.6: the real ``FP16_Optimizer.step``
    run on CPU over the standard overflow patterns
    (``tests/test_conformance_deepspeed_megatron.py``; ``FP16_UnfusedOptimizer`` by its source).

    Sources (DeepSpeed 0.19.6): ``deepspeed/runtime/fp16/fused_optimizer.py`` and
    ``unfused_optimizer.py`` (``_update_scale``, ``step``), ``LossScaleConfig`` in
    ``deepspeed/runtime/fp16/loss_scaler.py``.

    - overflow: ``cur_scale = max(cur_scale / scale_factor, min_loss_scale)`` and
      ``last_overflow_iter = cur_iter``: no hysteresis (the config's ``hysteresis`` is not
      read), and at the floor the scale stays there, no error;
    - clean step: DeepSpeed's ``stable_interval`` rule, as in preset ``deepspeed``;
    - overflow test: ``CheckOverflow.has_overflow``, in 0.19.6 ``has_inf_or_nan`` on each
      fp16 gradient (any inf or NaN: ``"nonfinite"``, as preset ``deepspeed``); up to 0.19.5
      a float32 sum of each gradient (``overflow_check="sum"``). Not modelled: the legacy
      fused-Adam / fused-LAMB steps, which flag an inf or NaN gradient *norm*
      (``check_using_norm``);
    - defaults: the engine's fp16 config (``2**16``, window 1000, floor 1); built without
      loss-scale arguments, ``FP16_Optimizer`` starts at ``2**32`` (floor 1) and
      ``FP16_UnfusedOptimizer`` at ``2**16`` (floor 0.25): give them as overrides.
    """
    return _deepspeed(**{**dict(hysteresis=1, raise_at_min=False, name="deepspeed-fp16",
                                source="deepspeed/runtime/fp16/fused_optimizer.py "
                                       "FP16_Optimizer._update_scale"), **kw})


def _megatron(**kw) -> DynamicScaler:
    """Megatron-LM / Megatron-Core ``DynamicGradScaler`` with the default optimizer config.
    Checked against megatron-core 0.16.1: the real ``DynamicGradScaler`` run on CPU over the
    standard overflow patterns (``tests/test_conformance_deepspeed_megatron.py``).

    Sources: ``megatron/core/optimizer/grad_scaler.py`` (``MegatronGradScaler.__init__``,
    ``inv_scale``, ``DynamicGradScaler.__init__``, ``DynamicGradScaler.update``),
    ``megatron/core/optimizer/__init__.py`` (``growth_factor=2.0, backoff_factor=0.5``) and
    ``megatron/core/optimizer/optimizer_config.py`` (``initial_loss_scale = 2**32``,
    ``min_loss_scale = 1.0``, ``loss_scale_window = 1000``, ``hysteresis = 2``).

    - Scale, minimum and both factors are float32 CUDA tensors: every product is a float32
      operation.
    - Overflow: ``growth_tracker = 0``; ``hysteresis_tracker -= 1``; if it is ``<= 0``:
      ``scale = torch.max(scale * backoff_factor, min_scale)``. The hysteresis counter keeps
      falling (0, -1, ...) with every further overflow and is refilled only by a growth, so
      after the first backoff every overflow backs off until the scale grows again.
    - Clean: ``growth_tracker += 1``; at ``== growth_interval`` the tracker resets, the
      hysteresis refills and ``scale = scale * growth_factor`` -- no ceiling and no
      finiteness test: from 2**32, 96 growths reach float32 inf, where the scale stays (every
      scaled gradient is then inf, and ``inf * 0.5`` is inf).
    - ``found_inf`` comes from ``torch._amp_foreach_non_finite_check_and_unscale_`` on the
      scaled gradients with ``inv_scale = scale.double().reciprocal().float()``, as torch.
    """
    return DynamicScaler(**{**dict(
        init_scale=2.0 ** 32, growth_factor=2.0, backoff_factor=0.5, backoff_op="multiply",
        growth_interval=1000, precision="float32", growth_compare="eq", tracker_start=0,
        finite_guard=False, min_scale=1.0, hysteresis=2, hysteresis_refill="growth",
        hysteresis_decrement_on_backoff=True, name="megatron",
        source="megatron/core/optimizer/grad_scaler.py DynamicGradScaler.update"), **kw})


def _tf_keras(**kw) -> DynamicScaler:
    """tf-keras (Keras 2) ``LossScaleOptimizer`` with its ``_DynamicLossScaleState``. Follows
    tf-keras's source; not run against a real tf-keras by fpsim's tests.

    Source: ``tf_keras/mixed_precision/loss_scale_optimizer.py`` (``_DynamicLossScaleState.
    update``, ``_assign_if_finite``, ``_is_all_finite``, ``BaseLossScaleOptimizer.
    get_unscaled_gradients``, ``_multiply_gradient``; the same code was
    ``keras/mixed_precision/loss_scale_optimizer.py`` before tf-keras split off).

    - ``current_loss_scale`` is a float32 variable (``_DEFAULT_INITIAL_SCALE = 2**15``);
      ``counter`` an int64 starting at 0; ``multiplier = 2``; ``growth_steps = 2000``.
    - Finite gradients: if ``counter + 1 >= growth_steps`` (``>=``, not ``==``) the new scale
      ``scale * multiplier`` is assigned only if finite (``_assign_if_finite``) and the
      counter is reset to 0 either way; otherwise the counter is incremented.
    - Non-finite: ``counter = 0``; ``scale = tf.maximum(scale / multiplier, 1)`` -- a floor
      of 1, which also lifts a scale that started below 1 up to 1 on its first backoff.
    - The finiteness test runs on the gradients the user passes to ``apply_gradients``,
      which are the *unscaled* ones (``get_unscaled_gradients`` multiplies by
      ``1. / loss_scale`` cast to the gradient's dtype): ``check_unscaled=True``.
    """
    return DynamicScaler(**{**dict(
        init_scale=2.0 ** 15, growth_factor=2.0, backoff_factor=2.0, backoff_op="divide",
        growth_interval=2000, precision="float32", growth_compare="ge", tracker_start=0,
        finite_guard=True, min_scale=1.0, check_unscaled=True, name="tf-keras",
        source="tf_keras/mixed_precision/loss_scale_optimizer.py "
               "_DynamicLossScaleState.update"), **kw})


def _keras3(**kw) -> DynamicScaler:
    """Keras 3 ``keras.optimizers.LossScaleOptimizer``. Checked against Keras 3.15.1 on the
    jax backend (the optional ``tests/test_conformance_jax.py``).

    Source: ``keras/src/optimizers/loss_scale_optimizer.py`` (``LossScaleOptimizer.build``,
    ``_stateful_handle_finite_grads``, ``_stateful_handle_non_finite_grads``,
    ``check_finite``; the stateless variants do the same).

    - ``dynamic_scale`` is a float32 variable initialised to ``initial_scale=2.0**15``;
      ``step_counter`` an int starting at 0; ``dynamic_growth_steps=2000``.
    - Finite: if ``step_counter == dynamic_growth_steps - 1``: counter 0 and
      ``scale = scale * 2.0`` -- no finiteness test, so the scale can reach inf; then every
      scaled gradient is inf, every step is skipped and ``inf / 2.0`` stays inf for ever.
    - Non-finite: counter 0, ``scale = scale / 2.0`` -- no floor: after 2**-149 the scale is
      0, scaled gradients are all 0 (finite, so nothing is skipped), the update divides them
      by 0 (NaN) and ``0 * 2.0`` keeps the scale at 0 for ever.
    - ``check_finite`` tests the *scaled* gradients; the finite branch then unscales with
      ``ops.divide(g, scale)``: a division, not a reciprocal multiply (``unscale_op="divide"``).
    - On the jax backend XLA's CPU code flushes subnormal results to zero, so the collapsing
      scale goes 2**-126 -> 0 where float32 gives 2**-127 (pinned by the optional test):
      ``precision="float32_ftz"`` models it (``preset("keras3", precision="float32_ftz")``).
    """
    return DynamicScaler(**{**dict(
        init_scale=2.0 ** 15, growth_factor=2.0, backoff_factor=2.0, backoff_op="divide",
        growth_interval=2000, precision="float32", growth_compare="eq", tracker_start=0,
        finite_guard=False, min_scale=None, unscale_op="divide", name="keras3",
        source="keras/src/optimizers/loss_scale_optimizer.py "
               "LossScaleOptimizer._stateful_handle_finite_grads"), **kw})


def _jmp(**kw) -> DynamicScaler:
    """DeepMind jmp ``DynamicLossScale``. Checked against jmp 0.0.4 with jax 0.10.2 (the
    optional ``tests/test_conformance_jax.py``).

    Source: ``jmp/_src/loss_scale.py`` (``DynamicLossScale.adjust``, ``DynamicLossScale.
    unscale``, ``all_finite``).

    - ``loss_scale`` is whatever array the user gives (the docstring's example:
      ``jnp.asarray(2. ** 15)``, float32); ``counter`` int32 zero; ``period=2000``;
      ``factor=2``; ``min_loss_scale`` float32 one.
    - ``adjust(grads_finite)``: if finite and ``counter == period - 1``:
      ``first_finite(loss_scale * factor, loss_scale)`` (growth only if finite); if not
      finite: ``jnp.maximum(min_loss_scale, loss_scale / factor)``; and always
      ``counter = ((counter + 1) % period) * grads_finite`` (``tracker_wraps=True``).
    - ``grads_finite`` is computed by the user with ``jmp.all_finite`` on the gradients after
      ``loss_scale.unscale`` (multiplication by ``1 / loss_scale``): ``check_unscaled=True``.
    - XLA on CPU flushes subnormal float32 results to zero, as Keras 3 on jax shows: a scale
      halved from 2**-126 is 0, not 2**-127. With jmp's default minimum 1 the scale never
      gets there; without a floor (a custom ``min_loss_scale``, eager only: under jit it is
      forgotten, see ``jax_adapters``) ``precision="float32_ftz"`` models it
      (``preset("jmp", precision="float32_ftz", min_scale=None)``; that precision takes no
      subnormal minimum). Not run against jmp here: jax is not installed by CI.
    """
    return DynamicScaler(**{**dict(
        init_scale=2.0 ** 15, growth_factor=2.0, backoff_factor=2.0, backoff_op="divide",
        growth_interval=2000, precision="float32", growth_compare="eq", tracker_start=0,
        tracker_wraps=True, finite_guard=True, min_scale=1.0, check_unscaled=True,
        name="jmp", source="jmp/_src/loss_scale.py DynamicLossScale.adjust"), **kw})


PRESETS = {"torch": _torch, "apex": _apex, "deepspeed": _deepspeed,
           "deepspeed-fp16": _deepspeed_fp16, "megatron": _megatron, "tf-keras": _tf_keras,
           "keras3": _keras3, "jmp": _jmp}


# what people call the frameworks, where it is not a preset's own name
_CALLED = {"pytorch": "torch", "amp": "torch", "gradscaler": "torch", "nvidia-apex": "apex",
           "megatron-core": "megatron", "megatron-lm": "megatron", "keras": "keras3",
           "tensorflow": "tf-keras", "tf": "tf-keras"}


def _suggestion(key: str) -> str:
    """" (did you mean 'torch'?)" for a name close to, or commonly used for, a preset."""
    import difflib
    close = _CALLED.get(key) or next(iter(difflib.get_close_matches(key, PRESETS, 1, 0.6)),
                                     None)
    return f" (did you mean {close!r}?)" if close else ""


def preset_names() -> tuple[str, ...]:
    return tuple(PRESETS)


def preset(name: str, **overrides) -> DynamicScaler:
    """The ``DynamicScaler`` that reproduces framework ``name``'s scale and skip decisions
    step by step; ``overrides`` replace any of its parameters (``growth_interval=100``,
    ``min_scale=None``, ...). Names: torch, apex, deepspeed (ZeRO), deepspeed-fp16 (the
    non-ZeRO fp16 optimizers), megatron, tf-keras, keras3, jmp (``_`` may stand for ``-``).
    """
    if not isinstance(name, str):
        raise TypeError(f"preset name must be a str, got {type(name).__name__}")
    key = name.strip().lower().replace("_", "-")
    if key not in PRESETS:
        raise ValueError(f"unknown loss-scaling preset {name!r}{_suggestion(key)}; valid "
                         f"names: {', '.join(PRESETS)}")
    valid = DynamicScaler.field_names()
    unknown = sorted(set(overrides) - set(valid))
    if unknown:
        raise ValueError(f"unknown override(s) {', '.join(map(repr, unknown))} for preset "
                         f"{key!r}; valid keys: {', '.join(valid)}")
    return PRESETS[key](**overrides)
