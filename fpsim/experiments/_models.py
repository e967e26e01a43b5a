"""The model and data experiments 1 (underflow) and 2 (loss curves) share.

A deep, narrow ReLU MLP (16 -> 32 x 10 -> 8) whose weights start small: PyTorch's default
``Linear`` draw U(+-1/sqrt(fan_in)) times ``GAIN`` = 0.4 (biases keep the default). Each layer
then multiplies a gradient on its way down by about sqrt(fan_in) * std(w) * sqrt(1/2) (the ReLU
passes about half) = 0.4 / sqrt(6) ~ 2**-2.6, so activation gradients fall by two to three
octaves a layer: near the output they are ordinary fp16 numbers, near the input they are far
below fp16's smallest subnormal (2**-24). The forward pass does not shrink the same way: the
biases hold every layer's outputs up (medians between 2**-4.3 and 2**-1.1 at initialisation,
fewer than 0.1% of the nonzero ones below fp16's smallest normal 2**-14), so the forward pass
in fp16 is sound and only the backward pass underflows.

The data are eight Gaussian blobs in 16 dimensions (``make_dataset("blobs")``: seeded draws
and elementwise float64 arithmetic, cast to float32; no BLAS, no transcendental functions, so
the same bits on every machine). They are linearly separable, but the class information enters
only through the first layers, which must grow before the signal survives ten small layers:
exactly the layers whose gradients fp16 loses.

Adam (lr 2e-3) makes those tiny gradients matter: its step, m / (sqrt(v) + eps), does not
depend on the gradient's size, so in fp32 a first-layer gradient of 2**-28 moves a weight about
as far as one of 2**-8 would (down to eps = 1e-8 ~ 2**-26.6, below which the step shrinks in
proportion). A gradient that is exactly zero does not move it at all.
"""
from __future__ import annotations

from .. import nn
from ..optim import Adam, Optimizer
from ..train import Dataset, make_dataset

__all__ = ["FEATURES", "WIDTH", "DEPTH", "CLASSES", "GAIN", "LR", "BATCH", "blobs",
           "small_init_mlp", "adam", "linear_layers"]

FEATURES, WIDTH, DEPTH, CLASSES = 16, 32, 10, 8
GAIN = 0.4          # times PyTorch's default weight bound 1/sqrt(fan_in)
LR = 2e-3           # Adam's learning rate
BATCH = 64


def blobs() -> Dataset:
    """2048 samples of eight Gaussian blobs in 16 dimensions (seed 0)."""
    return make_dataset("blobs", n=2048, features=FEATURES, classes=CLASSES, seed=0)


def small_init_mlp(seed: int = 0) -> nn.Sequential:
    """The 11-layer ReLU MLP with weights drawn as PyTorch does and then multiplied by GAIN
    (``w.mul_(0.4)`` after construction; the product is rounded once to fp32)."""
    model = nn.MLP([FEATURES] + [WIDTH] * DEPTH + [CLASSES], activation="relu", rng=seed)
    state = model.state_dict()
    model.load_state_dict({name: values.astype("float64") * GAIN if name.endswith("weight")
                           else values for name, values in state.items()})
    return model


def adam(model) -> Optimizer:
    """Adam with torch's defaults but lr 2e-3, on an fp32 master copy."""
    return Optimizer(model, Adam(lr=LR))


def linear_layers(model) -> list[str]:
    """Names of the model's weight matrices, input side first ("0.weight", "2.weight", ...)."""
    return [name for name, _ in model.named_parameters() if name.endswith("weight")]
