"""Delayed scaling against NVIDIA Transformer Engine itself (needs a CUDA GPU and
``transformer_engine``; marked ``gpu``, run with ``python -m pytest -m gpu``).

A ``te.Linear`` under ``fp8_autocast(DelayedScaling(...))`` and an ``nn.Linear`` under the same
recipe string see the same inputs and gradients for a dozen steps (an outlier, a zero input and
a NaN-free tail among them); after each step the amax histories and scales of the input, the
weight and the output gradient must be TE's, bit for bit. The forward outputs are compared
loosely: cuBLAS's FP8 GEMM sums in its own order.
"""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="Transformer Engine runs on PyTorch")
if not torch.cuda.is_available():
    pytest.skip("Transformer Engine needs a CUDA device; none here", allow_module_level=True)
te = pytest.importorskip("transformer_engine.pytorch",
                         reason="transformer_engine is not installed")
recipe_module = pytest.importorskip("transformer_engine.common.recipe",
                                    reason="transformer_engine is not installed")

from fpsim import nn  # noqa: E402
from fpsim.autograd import Policy, Tensor, use_policy  # noqa: E402

HISTORY, MARGIN, IN, OUT, BATCH = 4, 1, 32, 32, 16


def _inputs(rng, step):
    x = rng.standard_normal((BATCH, IN)).astype(np.float32)
    if step == 4:
        x[0] *= np.float32(2.0 ** 10)            # an outlier
    if step == 7:
        x[:] = 0                                 # nothing to record
    g = (rng.standard_normal((BATCH, OUT)) * 2.0 ** -12).astype(np.float32)
    return x, g


@pytest.mark.parametrize("algo", ["max", "most_recent"])
def test_delayed_scaling_state_is_transformer_engines(algo):
    recipe = recipe_module.DelayedScaling(margin=MARGIN, amax_history_len=HISTORY,
                                          amax_compute_algo=algo,
                                          fp8_format=recipe_module.Format.HYBRID)
    theirs = te.Linear(IN, OUT, bias=False, params_dtype=torch.float32).cuda()
    ours = nn.Linear(IN, OUT, bias=False, rng=0)
    with torch.no_grad():
        theirs.weight.copy_(torch.from_numpy(ours.weight.numpy()).cuda())
    policy = Policy(matmul="fp32", fp8=f"fp8-delayed:history={HISTORY},margin={MARGIN},"
                                       f"algo={algo}", name="fp8-delayed-fp32")
    rng = np.random.default_rng(5)
    for step in range(12):
        x, g = _inputs(rng, step)
        tx = torch.from_numpy(x).cuda().requires_grad_(True)
        with te.fp8_autocast(enabled=True, fp8_recipe=recipe):
            ty = theirs(tx)
        ty.backward(torch.from_numpy(g).cuda())
        with use_policy(policy):
            y = ours(Tensor(x, requires_grad=True))
            y.backward(g)
            slots = ours.gemm_slots()
            slots.begin("forward", policy.fp8)     # TE updates the gradient's state now
        fwd, bwd = theirs.fp8_meta["scaling_fwd"], theirs.fp8_meta["scaling_bwd"]
        for role, meta, index in (("input", fwd, 0), ("weight", fwd, 1),
                                  ("grad_output", bwd, 0)):
            state = slots.states[role]
            te_history = meta.amax_history[:, index].cpu().numpy().tolist()
            assert list(state.amax_history) == te_history, (step, role)
            assert state.scale == float(meta.scale[index]), (step, role)
        np.testing.assert_allclose(y.numpy(), ty.detach().cpu().numpy(), rtol=1e-5,
                                   atol=1e-6)
