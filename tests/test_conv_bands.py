"""conv2d in bands (issue 44): the im2col columns and dW's operands are unfolded band by band
(``tuning().conv_band_share``, ``conv_weight_band_share``), never a padded or zero-stuffed
copy of the input or the gradient, and the bias joins each forward band through the exact
model's certified 2-D path (``fast_matmul.matmul_2d`` with its fp32 epilogue) where it applies.

Bands are rows (forward, dx) or rows and columns (dW) of the outputs, never the reduction:
every element is the same dot product whatever the bands, so the smallest bands and one band
must give the same bits, for every accumulation model, also where the certificate cannot
decide (exact ties, cancellation, signed zeros, subnormals, overflow) and where the fast path
does not apply (NaN/inf: those bands take the general path). The peak memory of the forward
pass, dx and dW stays within 4 times the input.
"""
import threading
import tracemalloc

import numpy as np
import pytest

import fpsim.autograd as ag
from fpsim import backend
from fpsim.autograd import Tensor, use_policy
from fpsim.formats import FP16

SMALLEST = {"conv_band_share": 1e-9, "conv_weight_band_share": 1e-9,
            "conv_weight_part_share": 1e-9}
ONE_BAND = {"conv_band_share": 1e9, "conv_weight_band_share": 1e9,
            "conv_weight_part_share": 1e9}

# (N, C, H, W, O, kernel, stride, padding, dilation, groups)
GEOMETRIES = [
    (2, 3, 7, 6, 4, 3, 1, 1, 1, 1),
    (2, 4, 9, 8, 6, 3, 2, 2, 1, 2),
    (1, 2, 10, 9, 4, (2, 3), (2, 3), (3, 0), (2, 1), 2),
    (1, 1, 6, 6, 2, 2, 3, 4, 2, 1),   # padding > d (k - 1): gradient rows land on padding
    (3, 5, 8, 7, 6, 3, 2, 1, 1, 1),
]


def _shapes(geometry):
    n, c, h, w, o, kernel, _, _, _, groups = geometry
    kernel = kernel if isinstance(kernel, tuple) else (kernel, kernel)
    return (n, c, h, w), (o, c // groups) + kernel, (o,)


def _options(geometry):
    stride, padding, dilation, groups = geometry[6:]
    return {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}


def _run(values, geometry, policy, accumulation, tuning):
    """Output and the three gradients' bit patterns (uint of the container) under ``tuning``."""
    x, w, b, gy = values
    with use_policy(policy), backend.use_tuning(**tuning):
        tensors = [Tensor(v, requires_grad=True) for v in (x, w, b)]
        y = ag.conv2d(*tensors, accumulation=accumulation, **_options(geometry))
        y.backward(Tensor(gy, y.fmt))
    arrays = [backend.to_numpy(t.data) for t in [y] + [t.grad for t in tensors]]
    return [a.view(np.uint64 if a.dtype == np.float64 else np.uint32) for a in arrays]


def _values(geometry, rng, scale=1.0):
    xs, ws, bs = _shapes(geometry)
    x, w, b = (rng.standard_normal(s) * scale for s in (xs, ws, bs))
    with use_policy("32-true"), ag.no_grad():
        y_shape = ag.conv2d(Tensor(x), Tensor(w), **_options(geometry)).shape
    return x, w, b, rng.standard_normal(y_shape)


def _assert_same_bits(values, geometry, policy, accumulation=None):
    expected = _run(values, geometry, policy, accumulation, ONE_BAND)
    for tuning in (SMALLEST, {}):
        for name, ours, theirs in zip(("y", "dx", "dW", "db"),
                                      _run(values, geometry, policy, accumulation, tuning),
                                      expected):
            np.testing.assert_array_equal(ours, theirs, err_msg=f"{name} {tuning}")


@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("policy", ["32-true", "16-mixed", "bf16-mixed", "64-true"])
@pytest.mark.parametrize("accumulation", [None, "sequential:fp16", "blocked:4:fp32"])
def test_the_smallest_bands_and_one_band_give_the_same_bits(geometry, policy, accumulation):
    values = _values(geometry, np.random.default_rng(len(str(geometry))))
    _assert_same_bits(values, geometry, policy, accumulation)


def _adversarial(geometry, rng, case):
    """Inputs where the certificate must leave elements to the exact step, or where the fast
    path does not apply at all (non-finite values in some bands only)."""
    x, w, b, gy = _values(geometry, rng)
    if case == "ties":            # small integers: exact sums, many exact fp16 ties
        x, w, gy = (np.round(v * 4) for v in (x, w, gy))
        b = np.round(b * 4) / 8
    elif case == "cancellation":  # x's second half cancels the first: sums of +-0 and tiny
        half = x.shape[0] // 2 or 1
        x[half:] = -x[:half][: x.shape[0] - half]
        x[:, :, ::2] *= 2.0 ** 20
    elif case == "signed zeros":
        x[:, :, ::2] = -0.0
        w[w > 0.5] = -0.0
        b[:] = -0.0
        gy[:, :, ::2] = -0.0
    elif case == "subnormal":     # fp32 and fp16 subnormal products and sums
        x, w = x * 2.0 ** -70, w * 2.0 ** -64
        gy = gy * 2.0 ** -80
        b = b * 2.0 ** -130
    elif case == "overflow":      # fp16 overflows, fp32 does not
        x, w, gy = x * 300.0, w * 300.0, gy * 2.0 ** 14
    elif case == "non-finite":    # NaN and inf in one sample: its bands go the general way
        x[0, 0, 0, 0] = np.nan
        x[-1, -1, -1, -1] = np.inf
        w[0, 0, 0, 0] = -np.inf
        gy[0, 0, -1, -1] = np.nan
    return x, w, b, gy


@pytest.mark.parametrize("case", ["ties", "cancellation", "signed zeros", "subnormal",
                                  "overflow", "non-finite"])
@pytest.mark.parametrize("policy", ["32-true", "16-mixed", "bf16-mixed"])
@pytest.mark.parametrize("geometry", [GEOMETRIES[0], GEOMETRIES[2], GEOMETRIES[4]])
def test_adversarial_inputs_give_the_same_bits_in_any_bands(case, policy, geometry):
    with np.errstate(over="ignore", invalid="ignore"):
        values = _adversarial(geometry, np.random.default_rng(3), case)
    _assert_same_bits(values, geometry, policy)


@pytest.mark.parametrize("case", ["ties", "cancellation", "signed zeros", "subnormal",
                                  "overflow", "non-finite"])
@pytest.mark.parametrize("policy", ["32-true", "16-mixed"])
def test_dw_in_parts_is_the_products_bits(case, policy, monkeypatch):
    """dW on the exact fast path sums its reduction in parts of samples
    (``product_parts.matmul_in_parts``): the same bits as the bands' products taken whole by
    ``acc_matmul``, in the smallest parts (one sample, one open element at a time), one part
    and the default."""
    from fpsim.autograd import ops_conv
    geometry = GEOMETRIES[4]
    with np.errstate(over="ignore", invalid="ignore"):
        values = _adversarial(geometry, np.random.default_rng(7), case)
    prepared = {name: _run(values, geometry, policy, None, tuning)[2]
                for name, tuning in (("smallest", SMALLEST), ("one", ONE_BAND), ("default", {}))}
    monkeypatch.setattr(ops_conv, "_fast_path_applies", lambda *args: False)
    expected = _run(values, geometry, policy, None, {})[2]
    for name, dw in prepared.items():
        np.testing.assert_array_equal(dw, expected, err_msg=name)


@pytest.mark.parametrize("case", ["ties", "cancellation", "signed zeros", "subnormal",
                                  "overflow", "non-finite"])
@pytest.mark.parametrize("policy", ["32-true", "16-mixed", "64-true"])
def test_column_major_bands_give_the_bits_of_row_major_ones(case, policy, monkeypatch):
    """The forward pass and dx unfold their bands column-major (each column contiguous):
    the same output and gradients as row-major bands, for every accumulation path (the
    certified epilogue, the fast path, the general path on NaN/inf), in the smallest bands
    and the default ones."""
    from fpsim.autograd import ops_conv
    geometry = GEOMETRIES[1]
    with np.errstate(over="ignore", invalid="ignore"):
        values = _adversarial(geometry, np.random.default_rng(9), case)
    def quiet():                                           # 64-true's float64 BLAS: NaN
        return np.errstate(invalid="ignore", over="ignore")

    with quiet():
        ours = {name: _run(values, geometry, policy, None, tuning)
                for name, tuning in (("smallest", SMALLEST), ("default", {}))}
    unfold = ops_conv.unfold
    layouts = []

    def row_major(*args, column_major=False):
        layouts.append(column_major)
        return unfold(*args, column_major=False)

    monkeypatch.setattr(ops_conv, "unfold", row_major)
    for name, tuning in (("smallest", SMALLEST), ("default", {})):
        with quiet():
            their_run = _run(values, geometry, policy, None, tuning)
        for part, mine, theirs in zip(("y", "dx", "dW", "db"), ours[name], their_run):
            np.testing.assert_array_equal(mine, theirs, err_msg=f"{part} {name}")
    assert any(layouts) == (policy != "64-true")


@pytest.mark.parametrize("case", ["ties", "signed zeros", "subnormal", "overflow",
                                  "non-finite"])
def test_the_certified_bias_epilogue_is_the_accumulator_plus_bias_rounded(case):
    """16-mixed: each band's fused product (matmul_2d with the bias) is the fp32 accumulator
    (the convolution without bias under 32-true, on the fp16 values), plus the fp16 bias in
    float32, rounded once to fp16."""
    geometry = GEOMETRIES[4]
    with np.errstate(over="ignore", invalid="ignore"):
        x, w, b, _ = _adversarial(geometry, np.random.default_rng(5), case)
    x16, w16, b16 = (backend.to_numpy(backend.round_to(np.float32(v), FP16)) for v in (x, w, b))
    with ag.no_grad():
        with use_policy("32-true"):
            acc = backend.to_numpy(ag.conv2d(Tensor(x16), Tensor(w16), **_options(geometry)).data)
        with np.errstate(over="ignore", invalid="ignore"):
            expected = backend.to_numpy(backend.round_to(acc + b16[None, :, None, None], FP16))
        for tuning in (SMALLEST, ONE_BAND, {}):
            with use_policy("16-mixed"), backend.use_tuning(**tuning):
                y = ag.conv2d(Tensor(x), Tensor(w), Tensor(b), **_options(geometry))
            np.testing.assert_array_equal(backend.to_numpy(y.data).view(np.uint32),
                                          expected.view(np.uint32), err_msg=str(tuning))


def _peak_in_a_fresh_thread(call) -> int:
    """Peak bytes NumPy allocates during ``call`` in a new thread, whose per-thread work
    buffers (``backend.scratch``) start empty, so they are counted too."""
    peaks = []

    def traced():
        tracemalloc.start()
        try:
            call()
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()

    thread = threading.Thread(target=traced)
    thread.start()
    thread.join()
    return peaks[0]


@pytest.mark.numpy_only
@pytest.mark.parametrize("part, shape", [
    ("forward", (16, 16, 32, 32, 16)), ("dx", (16, 16, 32, 32, 16)),
    ("dW", (16, 16, 32, 32, 16)), ("dx", (64, 8, 14, 14, 16)), ("dW", (64, 8, 14, 14, 16))])
def test_forward_dx_and_dw_peak_within_four_times_the_input(part, shape):
    """N = 16, C = O = 16, 32 x 32, 3 x 3, padding 1, fp32 (the whole im2col would be 9 times
    the input, 18 in float64; before the bands, dW peaked at 8.9 times it), and the bench's
    layer, whose output and gradient are twice its input (dW peaked at 7.0 times it before
    its reduction came in parts): the peak includes what the pass returns (the output, dx),
    not the incoming gradient (the bench layer's forward pass returns twice its input:
    4.7x in all, not tested here)."""
    rng = np.random.default_rng(4)
    n, c, h, width, o = shape
    x = Tensor(rng.standard_normal((n, c, h, width)), requires_grad=part == "dx")
    w = Tensor(rng.standard_normal((o, c, 3, 3)), requires_grad=part == "dW")
    b = Tensor(rng.standard_normal(o))
    y = ag.conv2d(x, w, b, padding=1)              # imports and caches, outside the count
    if part == "forward":
        peak = _peak_in_a_fresh_thread(lambda: ag.conv2d(x, w, b, padding=1))
    else:
        seed = Tensor(rng.standard_normal(y.shape))
        y.backward(seed, retain_graph=True)
        x.zero_grad()
        w.zero_grad()
        peak = _peak_in_a_fresh_thread(lambda: y.backward(seed, retain_graph=True))
    assert peak < 4 * backend.to_numpy(x.data).nbytes
