"""``LSTM``: one layer, batch first, PyTorch's parameterisation and gate order (i, f, g, o).

For each step t, from engine ops, so every rounding follows the policy::

    gates = linear(x_t, W_ih, b_ih) + linear(h, W_hh, b_hh)        # (B, 4H), matmul category
    i, f, g, o = sigmoid(gates[:, :H]), sigmoid(gates[:, H:2H]), tanh(gates[:, 2H:3H]),
                 sigmoid(gates[:, 3H:])
    c = f * c + i * g;  h = o * tanh(c)

The input projections of all steps are one ``linear`` over (B, T, I) before the loop (cuDNN
does the same), which rounds exactly as the per-step products would. Under "16-mixed" the gate
products are fp16 and the elementwise cell math promotes: with the default fp32 zero state,
``c`` and ``h`` stay fp32 (as an LSTM written from cells under torch.autocast does; the fused
cuDNN kernel keeps its own internal precisions, which this model does not claim to copy).

>>> import numpy as np
>>> from fpsim.autograd import Tensor
>>> lstm = LSTM(3, 4, rng=0)
>>> out, (h, c) = lstm(Tensor(np.ones((2, 5, 3))))
>>> out.shape, h.shape, c.shape
((2, 5, 4), (2, 4), (2, 4))
"""
from __future__ import annotations

from ..backend import xp

from .. import autograd as ag
from . import init
from ..options import check_count
from .module import Module, parameter
from .gemm import GemmModule

__all__ = ["LSTM"]


class LSTM(GemmModule):
    """One-layer batch-first LSTM: ``forward(x (B, T, I), state=None)`` returns
    ``(output (B, T, H), (h_T (B, H), c_T (B, H)))``; ``state`` is an optional ``(h0, c0)``.

    Parameters as ``torch.nn.LSTM`` (names without the ``_l0`` suffix): ``weight_ih``
    (4H, I), ``weight_hh`` (4H, H), ``bias_ih`` (4H), ``bias_hh`` (4H), all drawn
    U(+-1/sqrt(H)) in that order from ``rng``.
    """

    def __init__(self, input_size: int, hidden_size: int, *, rng=None, accumulation=None):
        super().__init__()
        check_count("input_size", input_size, 1)
        check_count("hidden_size", hidden_size, 1)
        rng = init.as_rng(rng)
        self.input_size, self.hidden_size = input_size, hidden_size
        self.accumulation = accumulation
        h4 = 4 * hidden_size
        self.weight_ih = parameter(init.fan_in_uniform(rng, (h4, input_size), hidden_size))
        self.weight_hh = parameter(init.fan_in_uniform(rng, (h4, hidden_size), hidden_size))
        self.bias_ih = parameter(init.fan_in_uniform(rng, (h4,), hidden_size))
        self.bias_hh = parameter(init.fan_in_uniform(rng, (h4,), hidden_size))

    def forward(self, x, state=None):
        x = ag.as_tensor(x)
        if x.ndim != 3 or x.shape[2] != self.input_size:
            raise ValueError(f"LSTM expects input (batch, time, {self.input_size}), got shape "
                             f"{x.shape}")
        batch, steps, _ = x.shape
        hid = self.hidden_size
        if state is None:
            zeros = xp.zeros((batch, hid))
            h, c = ag.Tensor(zeros), ag.Tensor(zeros)
        else:
            h, c = (ag.as_tensor(s) for s in state)
            for name, s in (("h0", h), ("c0", c)):
                if s.shape != (batch, hid):
                    raise ValueError(f"LSTM {name} must be ({batch}, {hid}), got {s.shape}")
        projected = ag.linear(x, self.weight_ih, self.bias_ih, accumulation=self.accumulation,
                              scaling_slots=self.gemm_slots("ih"))
        outputs = []
        for t in range(steps):
            gates = projected[:, t] + ag.linear(h, self.weight_hh, self.bias_hh,
                                                accumulation=self.accumulation,
                                                scaling_slots=self.gemm_slots("hh"))
            i = gates[:, :hid].sigmoid()
            f = gates[:, hid:2 * hid].sigmoid()
            g = gates[:, 2 * hid:3 * hid].tanh()
            o = gates[:, 3 * hid:].sigmoid()
            c = f * c + i * g
            h = o * c.tanh()
            outputs.append(h)
        return ag.stack(outputs, axis=1), (h, c)
