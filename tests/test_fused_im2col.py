"""The fused kernel ``unfold`` (``fpsim.backend.numba_im2col``, Numba) against the NumPy code of
``fpsim.autograd.im2col.unfold``, forced each way by ``use_compiled``: the same array (shape,
dtype, strides, contiguity, bits) for every geometry of ``test_conv_bands.GEOMETRIES``
(strides, dilation, padding beyond d (k - 1), groups as channel slices of the source,
non-square kernels) and its three readings (the forward pass and dW read x; dx reads g with
spread = stride and offsets d (k - 1) - padding; dW tap by tap in the float64 reference
mode), in bands at the edges (row ranges, batch slices, column ranges that start and stop
mid-channel, single columns as dW's ``cols_of`` takes them), row- and column-major, float32
and float64 (the whole-run copies of "same" convolutions and row by row), from sources that
are views (a channel slice of a larger array, reversed or strided axes, Fortran order, a
read-only broadcast), holding -0, NaN payloads (quiet and signalling) and inf.
End to end, ``conv2d``'s output and gradients are the same bits either way under 32-true,
16-mixed and 64-true. Planted bugs (a landing row skipped, zeros written as -0, zeros left
out at the edges, a transposed gradient's rows not aligned to its spread) are caught by
these inputs. Without
Numba these tests skip."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="Numba is not installed (pip install 'fpsim[fast]'); "
                    "im2col.unfold runs its NumPy code")

import fpsim.autograd as ag  # noqa: E402
from fpsim import backend  # noqa: E402
from fpsim.autograd import Tensor, use_policy  # noqa: E402
from fpsim.autograd.im2col import Unfolding, unfold  # noqa: E402
from fpsim.autograd.ops_conv import conv_output_size  # noqa: E402
from fpsim.backend import numba_im2col  # noqa: E402
from fpsim.rounding import use_compiled  # noqa: E402

from test_conv_bands import GEOMETRIES, SMALLEST  # noqa: E402

UINT = {np.dtype(np.float32): np.uint32, np.dtype(np.float64): np.uint64}
#: quiet and signalling NaNs with payloads, of both signs, as bit patterns
NANS = {np.float32: [0x7FC12345, 0xFFC00001, 0x7F812345, 0xFF800777],
        np.float64: [0x7FF8000000012345, 0xFFF8000000000001, 0x7FF0000000054321,
                     0xFFF0000000000777]}


@pytest.fixture
def restore_choice():
    previous = use_compiled(True)
    yield
    use_compiled(previous)


def pair(value):
    return value if isinstance(value, tuple) else (value, value)


def readings(geometry):
    """(name, source shape, Unfolding, output (rows, columns), channel groups) of the
    convolution's forward pass and dW (x), dx (g) and dW tap by tap in the float64 mode."""
    n, c, h, w, o, kernel, stride, padding, dilation, groups = geometry
    kernel, stride, padding, dilation = (pair(v) for v in (kernel, stride, padding, dilation))
    out = tuple(conv_output_size(*a) for a in zip((h, w), kernel, stride, padding, dilation))
    reads_x = Unfolding(kernel, stride, dilation, padding, (1, 1))
    reads_g = Unfolding(kernel, (1, 1), dilation,
                        tuple(d * (k - 1) - p for k, d, p in zip(kernel, dilation, padding)),
                        stride)
    found = [("x", (n, c, h, w), reads_x, out, groups),
             ("g", (n, o, *out), reads_g, (h, w), groups)]
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            tap = reads_x._replace(kernel=(1, 1), offset=(padding[0] - i * dilation[0],
                                                          padding[1] - j * dilation[1]))
            found.append((f"x tap {i},{j}", (n, c, h, w), tap, out, groups))
    return found


def special_values(shape, dtype, rng, view="channel slice"):
    """Random values with -0, inf, -inf and NaN payloads at random places, as ``view``: a
    channel slice of a larger array, or reversed, strided or Fortran-ordered memory."""
    n, c, h, w = shape
    big = rng.standard_normal((n, c + 3, h + 1, 2 * w + 1)).astype(dtype)
    flat = big.reshape(-1)
    picks = rng.choice(flat.size, size=(4, max(1, flat.size // 12)), replace=False)
    flat[picks[0]] = -0.0
    flat[picks[1]] = np.inf
    flat[picks[2]] = -np.inf
    nans = np.array(NANS[dtype], UINT[np.dtype(dtype)])
    flat.view(UINT[np.dtype(dtype)])[picks[3]] = nans[np.arange(picks.shape[1]) % 4]
    if view == "channel slice":
        return big[:, 2:2 + c, :h, :w]
    if view == "strided columns":
        return big[:, :c, :h, 1:2 * w + 1:2]
    if view == "reversed":
        return big[:, c - 1::-1, :h, :w][:, :, ::-1]
    if view == "fortran":
        return np.asfortranarray(big[:, :c, :h, :w])
    if view == "broadcast":                            # one sample seen n times (stride 0)
        return np.broadcast_to(big[:1, :c, :h, :w], shape)
    return np.ascontiguousarray(big[:, :c, :h, :w])


def assert_same_array(ours, theirs, label):
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, label
    assert ours.strides == theirs.strides, label
    for flag in ("C_CONTIGUOUS", "F_CONTIGUOUS", "OWNDATA", "WRITEABLE"):
        assert ours.flags[flag] == theirs.flags[flag], f"{label}: {flag}"
    uint = UINT[ours.dtype]
    assert np.array_equal(ours.view(uint), theirs.view(uint)), label


def both_ways(source, how, batch, rows, width, first, stop, column_major):
    """(compiled, NumPy) results of ``unfold``; the compiled one checked not declined."""
    use_compiled(True)
    assert numba_im2col.unfold(source, how.kernel, how.stride, how.dilation, how.offset,
                               how.spread, *batch.indices(source.shape[0])[:2], rows.start,
                               rows.stop, width, first, stop, column_major) is not None
    ours = unfold(source, how, batch, rows, width, first, stop, column_major=column_major)
    use_compiled(False)
    theirs = unfold(source, how, batch, rows, width, first, stop, column_major=column_major)
    use_compiled(True)
    return ours, theirs


def bands(n, rows_out, width, columns):
    """(batch, rows, width, first, stop): the whole band, bands at every edge, column ranges
    that start and stop mid-channel and beyond the source's channels, single columns."""
    yield slice(0, n), range(rows_out), width, 0, columns
    yield slice(n - 1, n), range(rows_out - 1, rows_out), width, 0, columns
    yield slice(0, 1), range(0, 1), width, 1, max(2, columns - 1)
    yield slice(0, n), range(1, rows_out), width, columns // 2, columns + 5
    yield slice(1, n + 4), range(rows_out // 2, rows_out + 2), width, 2, 3
    for c in (0, columns // 3, columns - 1):
        yield slice(0, n), range(rows_out), width, c, c + 1
    yield slice(0, 0), range(rows_out), width, 0, columns       # no sample
    yield slice(0, n), range(2, 2), width, 0, columns            # no row
    yield slice(0, n), range(rows_out), 0, 0, columns            # no column position
    yield slice(0, n), range(-2, 1), width + 2, 0, columns      # beyond the output


@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_reading_band_and_layout_gives_the_reference_array(geometry, dtype,
                                                                 restore_choice):
    rng = np.random.default_rng(len(str(geometry)))
    for name, shape, how, (p, q), groups in readings(geometry):
        n, channels = shape[:2]
        per_group = channels // groups
        # float32 from a channel slice (rows run by rows), float64 C-ordered (whole runs)
        source = special_values(shape, dtype, rng,
                                "channel slice" if dtype == np.float32 else "contiguous")
        taps = how.kernel[0] * how.kernel[1]
        for group in range(groups):
            part = source[:, group * per_group:(group + 1) * per_group]
            for batch, rows, width, first, stop in bands(n, p, q, per_group * taps):
                for column_major in (True, False):
                    label = f"{name} group {group} {batch} {rows} {first}:{stop} {column_major}"
                    assert_same_array(*both_ways(part, how, batch, rows, width, first, stop,
                                                 column_major), label)


@pytest.mark.parametrize("view", ["contiguous", "channel slice", "strided columns", "reversed",
                                  "fortran", "broadcast"])
def test_sources_of_any_layout_give_the_reference_array(view, restore_choice):
    rng = np.random.default_rng(11)
    for geometry in (GEOMETRIES[0], GEOMETRIES[2]):
        for name, shape, how, (p, q), _ in readings(geometry)[:3]:
            source = special_values(shape, np.float32, rng, view)
            k = shape[1] * how.kernel[0] * how.kernel[1]
            for column_major in (True, False):
                assert_same_array(*both_ways(source, how, slice(0, shape[0]), range(p), q, 0,
                                             k, column_major), f"{view} {name}")


def test_stride_one_same_convolutions_take_whole_runs(restore_choice):
    """The fast run of a "same" convolution (its rows copied in one run per block, then the
    columns off the source's edges zeroed): kernels wider and narrower than the padding,
    dilation, asymmetric padding, a source with a single row or column."""
    rng = np.random.default_rng(5)
    for (h, w), kernel, dilation, padding in [((9, 8), (3, 3), (1, 1), (1, 1)),
                                              ((5, 7), (5, 3), (1, 2), (2, 2)),
                                              ((6, 6), (1, 5), (1, 1), (0, 2)),
                                              ((1, 9), (3, 3), (1, 1), (1, 1)),
                                              ((8, 1), (3, 1), (2, 1), (2, 0))]:
        how = Unfolding(kernel, (1, 1), dilation, padding, (1, 1))
        source = special_values((3, 4, h, w), np.float32, rng, "contiguous")
        for batch, rows, width, first, stop in bands(3, h, w, 4 * kernel[0] * kernel[1]):
            assert_same_array(*both_ways(source, how, batch, rows, width, first, stop, True),
                              f"{kernel} {dilation} {padding} {rows} {first}:{stop}")


def test_declined_inputs_run_the_reference(restore_choice):
    """float16 sources, another library's arrays, an axis with stride and spread both above
    1, empty column ranges: the kernel returns None and ``unfold`` runs its own code."""
    x = np.arange(2 * 2 * 5 * 5, dtype=np.float32).reshape(2, 2, 5, 5)
    plain = ((3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    args = (0, 2, 0, 5, 5, 0, 18, True)
    assert numba_im2col.unfold(x.astype(np.float16), *plain, *args) is None
    assert numba_im2col.unfold(x.tolist(), *plain, *args) is None
    assert numba_im2col.unfold(x.astype(">f4"), *plain, *args) is None
    both = ((3, 3), (2, 1), (1, 1), (1, 1), (2, 1))
    assert numba_im2col.unfold(x, *both, *args) is None
    assert numba_im2col.unfold(x, *plain, 0, 2, 0, 5, 5, 4, 4, True) is None
    assert numba_im2col.unfold(x, *plain, 0, 2, 0, 5, 5, -1, 4, True) is None
    half = x.astype(np.float16)
    how = Unfolding(*plain)
    ours = unfold(half, how, slice(0, 2), range(5), 5, 0, 18, column_major=True)
    use_compiled(False)
    theirs = unfold(half, how, slice(0, 2), range(5), 5, 0, 18, column_major=True)
    assert ours.dtype == theirs.dtype == np.float16 and ours.strides == theirs.strides
    assert np.array_equal(ours.view(np.uint16), theirs.view(np.uint16))


# --- planted bugs: the kernel's Python code (``py_func``) with one change each ---------------

span = numba_im2col._span.py_func     # the kernel's own, before the tests patch it


def span_skipping_a_row(lo, hi, tap, stride, spread, offset, size):
    start, count, step, source, source_step = span(
        lo, hi, tap, stride, spread, offset, size)
    if count > 1:                                  # the first landing position left out
        return start + step, count - 1, step, source + source_step, source_step
    return start, count, step, source, source_step


def span_unaligned(lo, hi, tap, stride, spread, offset, size):
    """The spread branch without its alignment to the next multiple of spread."""
    base = tap - offset
    if spread == 1:
        return span(lo, hi, tap, stride, spread, offset, size)
    first = max(lo, -base)
    last = min(hi - 1, spread * (size - 1) - base)
    if last < first:
        return 0, 0, 1, 0, 1
    return first - lo, (last - first) // spread + 1, spread, (first + base) // spread, 1


def zeros_as_negative_zeros(out, lo, hi):
    for k in range(lo, hi):
        out[k] = out.dtype.type(1) << out.dtype.type(8 * out.itemsize - 1)


def single_zeros_missing(out, lo, hi):
    """Runs of one zero left out: a whole run's edge columns keep the neighbouring row's
    values (or whatever the new array held)."""
    for k in range(lo, hi if hi - lo > 1 else lo):
        out[k] = 0


PLANTED = {"a landing row skipped": ("_span", span_skipping_a_row),
           "rows not aligned to the spread": ("_span", span_unaligned),
           "zeros written as -0": ("_zeros", zeros_as_negative_zeros),
           "edge zeros missing": ("_zeros", single_zeros_missing)}


@pytest.mark.parametrize("bug", list(PLANTED))
def test_planted_bugs_are_caught(bug, monkeypatch, restore_choice):
    """The kernel's loops run as Python (``py_func``) agree with the reference on a few
    bands; with one planted change they do not, on the inputs of the tests above."""
    for name in ("_fill_by_columns", "_fill_by_rows", "_spans", "_zeros", "_copy", "_span"):
        monkeypatch.setattr(numba_im2col, name, getattr(numba_im2col, name).py_func)
    geometry = GEOMETRIES[1]
    rng = np.random.default_rng(2)
    cases = []
    for _name, shape, how, (p, q), _ in readings(GEOMETRIES[0])[:1] + readings(geometry)[:2]:
        k = shape[1] * how.kernel[0] * how.kernel[1]
        for view in ("channel slice", "contiguous"):      # row by row, whole runs
            source = special_values(shape, np.float32, rng, view)
            cases += [(source, how, slice(0, 2), range(p), q, 0, k, major) for major in (1, 0)]

    def differences():
        return sum(not np.array_equal(*(a.view(np.uint32) for a in both_ways(*case)))
                   for case in cases)

    assert differences() == 0
    target, planted = PLANTED[bug]
    monkeypatch.setattr(numba_im2col, target, planted)
    assert differences() > 0


# --- end to end: conv2d both ways --------------------------------------------------------------

def conv_bits(values, geometry, policy, tuning):
    x, w, b, gy = values
    options = dict(zip(("stride", "padding", "dilation", "groups"), geometry[6:]))
    with use_policy(policy), backend.use_tuning(**tuning), np.errstate(invalid="ignore",
                                                                       over="ignore"):
        tensors = [Tensor(v, requires_grad=True) for v in (x, w, b)]
        y = ag.conv2d(*tensors, **options)
        y.backward(Tensor(gy, y.fmt))
    arrays = [backend.to_numpy(t.data) for t in [y] + [t.grad for t in tensors]]
    return [a.view(UINT[a.dtype]) for a in arrays]


@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("policy", ["32-true", "16-mixed", "64-true"])
def test_conv2d_gives_the_same_bits_with_and_without_the_kernel(geometry, policy,
                                                                restore_choice):
    n, c, h, w, o, kernel, stride, padding, dilation, groups = geometry
    kernel = pair(kernel)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, c, h, w))
    x[:, :, ::3] = -0.0
    x[0, 0, -1, -1] = np.inf
    weights = rng.standard_normal((o, c // groups) + kernel)
    out = [conv_output_size(*a) for a in zip((h, w), kernel, pair(stride), pair(padding),
                                             pair(dilation))]
    gy = rng.standard_normal((n, o, *out))
    gy[-1, -1, 0, 0] = np.nan
    values = (x, weights, rng.standard_normal(o), gy)
    for tuning in ({}, SMALLEST):
        use_compiled(True)
        ours = conv_bits(values, geometry, policy, tuning)
        use_compiled(False)
        theirs = conv_bits(values, geometry, policy, tuning)
        for part, mine, reference in zip(("y", "dx", "dW", "db"), ours, theirs):
            np.testing.assert_array_equal(mine, reference, err_msg=f"{part} {tuning}")
