"""Adapters for DeepMind jmp's ``DynamicLossScale`` and Keras 3's ``LossScaleOptimizer``.

Optional dependencies, neither needed by fpsim nor installed by its CI: jmp needs jax
(``pip install jax jmp``: a ~90 MB CPU wheel); Keras 3 needs a backend (``pip install keras
jax`` and ``KERAS_BACKEND=jax``, set before keras is first imported).

``JmpAdapter``
    Calls ``DynamicLossScale.adjust(grads_finite)`` with ``grads_finite = not found_inf``
    (jitted by default, as training code runs it; ``jit=False`` for eager). Reports the
    counter as the growth tracker. jmp does not skip steps itself (users
    ``jmp.select_tree`` on ``grads_finite``), so skips are taken to be the overflows.
    Quirk: ``DynamicLossScale.tree_unflatten`` rebuilds the state without
    ``min_loss_scale``, so under ``jax.jit`` a custom minimum silently becomes the default
    1.0; the jitted adapter therefore refuses a minimum other than 1.
``KerasLossScaleAdapter``
    Calls ``LossScaleOptimizer.apply(grads, [variable])`` on a one-element variable with a
    gradient of ``inf`` (overflow) or ``1.0``: the overflow test is Keras's own
    ``check_finite``; with the jax backend through ``stateless_apply`` (as Keras's jax trainer
    does; the stateful ``apply`` cannot run eagerly there), with others through ``apply``.
    The growth tracker is ``step_counter``; a step counts as skipped when the inner
    optimizer's ``iterations`` did not advance.

>>> from fpsim.conformance import compare
>>> compare(JmpAdapter(period=3), [False] * 7 + [True], "jmp", growth_interval=3).agree
True
"""
from __future__ import annotations

import numpy as np

__all__ = ["JmpAdapter", "KerasLossScaleAdapter"]


class JmpAdapter:
    """``jmp.DynamicLossScale`` as a conformance adapter (see the module docstring)."""

    def __init__(self, loss_scale=None, *, init_scale: float = 2.0 ** 15, period: int = 2000,
                 factor: int = 2, min_loss_scale: float = 1.0, jit: bool = True) -> None:
        try:
            import jax
            import jax.numpy as jnp
            import jmp
        except ImportError as err:
            raise ImportError("JmpAdapter needs jax and jmp: pip install jax jmp") from err
        self._jnp = jnp
        if loss_scale is None:
            loss_scale = jmp.DynamicLossScale(
                jnp.asarray(init_scale, jnp.float32), period=period, factor=factor,
                min_loss_scale=jnp.asarray(min_loss_scale, jnp.float32))
        if jit and float(loss_scale.min_loss_scale) != 1.0:
            raise ValueError("under jax.jit jmp's DynamicLossScale forgets min_loss_scale "
                             "(tree_unflatten rebuilds it with the default 1.0); use jit=False "
                             "for another minimum")
        self._state = loss_scale
        self._adjust = jax.jit(lambda s, finite: s.adjust(finite)) if jit else (
            lambda s, finite: s.adjust(finite))
        self.name = f"jax {jax.__version__} jmp DynamicLossScale" + (" (jit)" if jit else "")

    @property
    def scale(self) -> float:
        return float(np.asarray(self._state.loss_scale))

    def update(self, found_inf: bool) -> float:
        self._state = self._adjust(self._state, self._jnp.asarray(not found_inf))
        return float(np.asarray(self._state.loss_scale))

    def state(self) -> dict:
        return {"growth_tracker": int(np.asarray(self._state.counter))}


class KerasLossScaleAdapter:
    """Keras 3 ``keras.optimizers.LossScaleOptimizer`` as a conformance adapter."""

    def __init__(self, optimizer=None, *, initial_scale: float = 2.0 ** 15,
                 dynamic_growth_steps: int = 2000) -> None:
        try:
            import keras
        except ImportError as err:
            raise ImportError("KerasLossScaleAdapter needs Keras 3 and a backend: pip install "
                              "keras jax, and set KERAS_BACKEND=jax before importing keras"
                              ) from err
        if optimizer is None:
            optimizer = keras.optimizers.LossScaleOptimizer(
                keras.optimizers.SGD(learning_rate=0.0), initial_scale=initial_scale,
                dynamic_growth_steps=dynamic_growth_steps)
        self.optimizer = optimizer
        self._variable = keras.Variable(np.zeros(1, np.float32))
        optimizer.build([self._variable])
        self._grads = {True: [np.full(1, np.inf, np.float32)],
                       False: [np.ones(1, np.float32)]}
        self._skipped: bool | None = None
        # The jax backend cannot run the stateful apply eagerly (its ops.cond traces the
        # branches); Keras's own jax trainer calls stateless_apply, and so does this adapter.
        self._stateless = keras.backend.backend() == "jax"
        self.name = (f"keras {keras.__version__} ({keras.backend.backend()}) "
                     f"LossScaleOptimizer")

    @property
    def scale(self) -> float:
        return float(np.asarray(self.optimizer.dynamic_scale))

    def update(self, found_inf: bool) -> float:
        optimizer = self.optimizer
        before = int(np.asarray(optimizer.inner_optimizer.iterations))
        grads = self._grads[bool(found_inf)]
        if self._stateless:
            _, values = optimizer.stateless_apply([v.value for v in optimizer.variables], grads,
                                                  [self._variable.value])
            for variable, value in zip(optimizer.variables, values):
                variable.assign(value)
        else:
            optimizer.apply(grads, [self._variable])
        self._skipped = int(np.asarray(self.optimizer.inner_optimizer.iterations)) == before
        return float(np.asarray(self.optimizer.dynamic_scale))

    def state(self) -> dict:
        return {"growth_tracker": int(np.asarray(self.optimizer.step_counter)),
                "skipped": self._skipped}
