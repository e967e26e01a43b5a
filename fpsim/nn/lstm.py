"""``LSTM``: batch first, one layer or several, PyTorch's parameterisation and gate order
(i, f, g, o).

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
from ..options import check_between, check_count
from .layers import Dropout
from .module import parameter
from .gemm import GemmModule

__all__ = ["LSTM"]


class LSTM(GemmModule):
    """Batch-first LSTM of ``num_layers`` stacked layers, each as the module doc's: layer
    k > 0 reads layer k - 1's outputs, after ``Dropout(dropout)`` in training mode (as
    ``torch.nn.LSTM``; masks from fpsim's Philox under ``seed``, so PyTorch's masks share
    only their distribution). ``forward(x (B, T, I), state=None)`` returns ``(output
    (B, T, H), (h_T, c_T))``: with one layer h_T and c_T are (B, H) and ``state`` an optional
    ``(h0, c0)`` of (B, H); with several they are (num_layers, B, H), as PyTorch's.

    Parameters as ``torch.nn.LSTM``'s, drawn U(+-1/sqrt(H)) from ``rng`` in its order (per
    layer: ``weight_ih`` (4H, in), ``weight_hh`` (4H, H), ``bias_ih`` (4H), ``bias_hh``
    (4H)). One layer keeps the names without the ``_l0`` suffix (``weight_ih``, ...);
    several take PyTorch's own (``weight_ih_l0``, ``weight_ih_l1``, ...), so torch's state
    dict loads as it is. GEMM sites: "ih" and "hh" for layer 0, "ih_l1", "hh_l1", ... after.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 dropout: float = 0.0, *, rng=None, accumulation=None, seed: int = 0):
        super().__init__()
        check_count("input_size", input_size, 1)
        check_count("hidden_size", hidden_size, 1)
        self.num_layers = check_count("num_layers", num_layers, 1)
        self.dropout = check_between("dropout", dropout, 0.0, 1.0)
        seed = check_count("seed", seed, 0)         # checked even where no dropout uses it
        rng = init.as_rng(rng)
        self.input_size, self.hidden_size = input_size, hidden_size
        self.accumulation = accumulation
        h4 = 4 * hidden_size
        for layer in range(self.num_layers):
            suffix = self._suffix(layer)
            inputs = input_size if layer == 0 else hidden_size
            for name, shape in (("weight_ih", (h4, inputs)), ("weight_hh", (h4, hidden_size)),
                                ("bias_ih", (h4,)), ("bias_hh", (h4,))):
                setattr(self, name + suffix,
                        parameter(init.fan_in_uniform(rng, shape, hidden_size)))
        if self.dropout > 0 and self.num_layers > 1:
            self.between = Dropout(self.dropout, seed=seed)

    def _suffix(self, layer: int) -> str:
        return "" if self.num_layers == 1 else f"_l{layer}"

    def forward(self, x, state=None):
        x = ag.as_tensor(x)
        if x.ndim != 3 or x.shape[2] != self.input_size:
            raise ValueError(f"LSTM expects input (batch, time, {self.input_size}), got shape "
                             f"{x.shape}")
        states = self._initial_states(x.shape[0], state)
        finals = []
        for layer, (h, c) in enumerate(states):
            if layer > 0 and self.dropout > 0 and self.training:
                x = self.between(x)
            x, (h, c) = self._layer(layer, x, h, c)
            finals.append((h, c))
        if self.num_layers == 1:
            return x, finals[0]
        return x, tuple(ag.stack([final[i] for final in finals], axis=0) for i in (0, 1))

    def _initial_states(self, batch: int, state):
        """[(h0, c0)] per layer: zeros (fp32) without ``state``, else its slices."""
        hid, layers = self.hidden_size, self.num_layers
        if state is None:
            zeros = xp.zeros((batch, hid))
            return [(ag.Tensor(zeros), ag.Tensor(zeros)) for _ in range(layers)]
        h, c = (ag.as_tensor(s) for s in state)
        shape = (batch, hid) if layers == 1 else (layers, batch, hid)
        for name, s in (("h0", h), ("c0", c)):
            if s.shape != shape:
                raise ValueError(f"LSTM {name} must be {shape}, got {s.shape}")
        if layers == 1:
            return [(h, c)]
        return [(h[layer], c[layer]) for layer in range(layers)]

    def _layer(self, layer: int, x, h, c):
        """One layer over all steps (module doc): (outputs (B, T, H), (h_T, c_T))."""
        suffix, hid = self._suffix(layer), self.hidden_size
        weight_hh, bias_hh = getattr(self, "weight_hh" + suffix), getattr(self, "bias_hh" + suffix)
        site = "" if layer == 0 else f"_l{layer}"
        projected = ag.linear(x, getattr(self, "weight_ih" + suffix),
                              getattr(self, "bias_ih" + suffix), accumulation=self.accumulation,
                              scaling_slots=self.gemm_slots("ih" + site))
        outputs = []
        for t in range(x.shape[1]):
            gates = projected[:, t] + ag.linear(h, weight_hh, bias_hh,
                                                accumulation=self.accumulation,
                                                scaling_slots=self.gemm_slots("hh" + site))
            i = gates[:, :hid].sigmoid()
            f = gates[:, hid:2 * hid].sigmoid()
            g = gates[:, 2 * hid:3 * hid].tanh()
            o = gates[:, 3 * hid:].sigmoid()
            c = f * c + i * g
            h = o * c.tanh()
            outputs.append(h)
        return ag.stack(outputs, axis=1), (h, c)
