"""The torch backend (issue 24): each namespace function and kernel gives NumPy's bits on
special values (signed zeros, subnormals, inf, NaN payloads where NumPy's rule fixes them,
huge and tiny values), for the argument forms the engine passes; torch's own functions that
do not (sqrt, maximum/minimum, sign, ldexp, cumsum, float divmod) are the traps the namespace
works around, and each has its test here.

Every test runs on the CPU ("torch") and again on a CUDA device ("torch:cuda", marked
``gpu``: deselected by default, run with ``-m gpu``, skipped with the reason where no CUDA
device is there). On CUDA, arithmetic returns the canonical NaN whatever the operands'
payloads, so there NaNs are compared by position and sign-free (``same_bits`` below); every
other bit is compared."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch backend needs PyTorch (fpsim[torch])")

import bit_patterns  # noqa: E402
from fpsim import backend, use_policy  # noqa: E402
from fpsim.backend import NAMESPACE  # noqa: E402
from fpsim.backend.torch_backend import TorchBackend  # noqa: E402
from fpsim.backend.torch_namespace import PLACEMENT, emulated_sqrt  # noqa: E402
from fpsim.formats import builtins  # noqa: E402
from fpsim.rounding import MODES, philox_uniforms, round_to  # noqa: E402
from fpsim.rounding.portable import round_to_portable  # noqa: E402
from test_backend_seam import _train_bits  # noqa: E402

OPS = TorchBackend()        # the device's backend while a test runs (fixture ``device``)
XP = OPS.xp
UINT = {np.float32: np.uint32, np.float64: np.uint64}
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(autouse=True, params=DEVICES)
def device(request):
    """The device every tensor of the test is made on: tensors made from host data go there
    (``PLACEMENT``), ``OPS`` is that device's backend and ``backend_name`` chooses it. The
    backend in force (NumPy, for the reference results) is left as it is."""
    global OPS
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device: torch.cuda.is_available() is False here")
    before = OPS
    OPS = TorchBackend(request.param)
    OPS.activate()
    try:
        yield request.param
    finally:
        OPS = before
        OPS.activate()


@pytest.fixture
def backend_name(device):
    """The name that chooses the torch backend on the test's device."""
    assert "torch" in backend.available()       # fpsim lists it when PyTorch is installed
    return "torch" if device == "cpu" else f"torch:{device}"


def same_bits(expected, got) -> bool:
    """Bit-identical; on CUDA a NaN matches any NaN (CUDA's arithmetic NaN is canonical)."""
    expected, got = np.asarray(expected), np.asarray(got)
    if PLACEMENT.device.type == "cpu" or expected.dtype.kind != "f":
        return bit_patterns.same_bits(expected, got)
    nan = np.isnan(expected)
    return (expected.shape == got.shape and (np.isnan(got) == nan).all()
            and bit_patterns.same_bits(expected[~nan], got[~nan]))


def specials(dtype) -> np.ndarray:
    """Signed zeros, subnormals, normals near the ends, inf, NaNs with payloads and signs."""
    info = np.finfo(dtype)
    values = [0.0, -0.0, info.smallest_subnormal, -info.smallest_subnormal,
              info.smallest_normal, -info.smallest_normal, info.smallest_normal / 3, 1.0, -1.0,
              1.5, -2.5, 3.0, 0.1, info.max, -info.max, info.max / 2, np.inf, -np.inf, 2.0, 7.0]
    x = np.array(values, dtype)
    uint = UINT[dtype]
    top = np.array(0x7FC00001 if dtype == np.float32 else 0x7FF8000000000003, uint)
    nans = np.array([top, top | (np.array(1, uint) << (31 if dtype == np.float32 else 63))],
                    uint).view(dtype)
    return np.concatenate([x, nans])


def random_bits(dtype, n, seed=0) -> np.ndarray:
    width = 32 if dtype == np.float32 else 64
    raw = np.random.default_rng(seed).integers(0, 2**63, n, dtype=np.uint64)
    return (raw if width == 64 else raw.astype(np.uint32)).view(dtype)


def t(x):
    return OPS.asarray(x, x.dtype)


def host(x):
    return OPS.to_numpy(x)


def test_every_namespace_name_is_there():
    assert sorted(name for name in NAMESPACE if not hasattr(XP, name)) == []


#: the namespace's sqrt (NumPy's on the CPU) and the exact emulation other devices use
SQRTS = {"sqrt": lambda x: XP.sqrt(x), "emulated": emulated_sqrt}


@pytest.mark.parametrize("sqrt", SQRTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sqrt_is_correctly_rounded_on_random_bit_patterns(dtype, sqrt):
    x = np.abs(random_bits(dtype, 100_000))          # torch's own sqrt misses ~1-17% of these
    with np.errstate(invalid="ignore"):
        assert same_bits(np.sqrt(x), host(SQRTS[sqrt](t(x))))
        square = x[:40_000].reshape(200, 200)
        assert same_bits(np.sqrt(square.T), host(SQRTS[sqrt](t(square).T)))   # strided


@pytest.mark.parametrize("sqrt", SQRTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sqrt_hard_cases_exact_squares_their_neighbours_and_specials(dtype, sqrt):
    rng = np.random.default_rng(1)
    k = rng.integers(1, 2**12 if dtype == np.float32 else 2**26, 30_000).astype(dtype)
    squares = k * k
    cases = np.concatenate([squares, np.nextafter(squares, np.inf), np.nextafter(squares, 0),
                            squares * dtype(2.0) ** -140, np.nextafter(dtype(4), 0) * k,
                            specials(dtype)])
    with np.errstate(invalid="ignore"):
        expected = np.sqrt(cases)            # -0 -> -0, x < 0 -> -NaN, NaN keeps its payload
    assert same_bits(expected, host(SQRTS[sqrt](t(cases))))
    assert same_bits(expected[:1], host(SQRTS[sqrt](t(cases[:1]).reshape(()))).reshape(1))


def test_sqrt_of_a_negative_number_is_numpys_negative_nan():
    got = host(XP.sqrt(t(np.array([-1.0, -np.inf]))))
    assert np.signbit(got).all() and np.isnan(got).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_maximum_minimum_signed_zero_ties_and_nan_payloads(dtype, name):
    x = specials(dtype)
    a, b = np.repeat(x, x.size), np.tile(x, x.size)     # every ordered pair, both lengths
    for n in (a.size, 3):
        expected = getattr(np, name)(a[:n], b[:n])
        assert same_bits(expected, host(getattr(XP, name)(t(a[:n]), t(b[:n]))))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_frexp_ldexp_nextafter_spacing(dtype):
    x = np.concatenate([specials(dtype), random_bits(dtype, 20_000, seed=2)])
    mantissa, exponent = np.frexp(x)
    got_m, got_e = XP.frexp(t(x))
    finite = np.isfinite(x)                  # NumPy's exponent for inf and NaN is unspecified
    assert same_bits(mantissa, host(got_m)) and (exponent[finite] == host(got_e)[finite]).all()
    shifts = np.random.default_rng(3).integers(-1200, 1200, x.size)
    with np.errstate(all="ignore"):
        assert same_bits(np.ldexp(x, shifts), host(XP.ldexp(t(x), t(shifts))))
        assert same_bits(np.ldexp(1.0, shifts), host(XP.ldexp(1.0, t(shifts))))
        towards = np.roll(x, 1)
        assert same_bits(np.nextafter(x, towards), host(XP.nextafter(t(x), t(towards))))
        expected = np.spacing(x)
        got = host(XP.spacing(t(x)))
    nan = np.isnan(expected)
    assert (np.isnan(got) == nan).all() and same_bits(expected[~nan], got[~nan])


def test_divmod_and_floor_with_negatives():
    ints = np.array([-7, -6, -1, 0, 1, 6, 7, 2**40 + 3, -(2**40) - 3])
    for n in (3, -3, 5):
        quotient, remainder = XP.divmod(t(ints), n)
        assert (host(quotient) == ints // n).all() and (host(remainder) == ints % n).all()
    x = np.concatenate([specials(np.float64), random_bits(np.float64, 5000, 4)])
    with pytest.raises(TypeError, match="integer arrays"):     # torch's fmod is not exact
        XP.divmod(t(x), 3.0)
    assert same_bits(np.floor(x), host(XP.floor(t(x))))


def test_bincount_with_float64_weights_sums_in_numpys_order():
    rng = np.random.default_rng(6)
    index = rng.integers(0, 50, 20_000)
    weights = rng.standard_normal(20_000) * 2.0 ** rng.integers(-40, 40, 20_000)
    expected = np.bincount(index, weights=weights, minlength=60)
    assert same_bits(expected, host(XP.bincount(t(index), weights=t(weights), minlength=60)))


def test_cumsum_is_sequential_in_the_arrays_dtype():
    x = (np.random.default_rng(7).standard_normal((5, 300)) * 1e5).astype(np.float32)
    x[0, 3] = np.inf
    assert same_bits(np.cumsum(x, axis=1), host(XP.cumsum(t(x), axis=1)))
    assert same_bits(np.cumsum(x), host(XP.cumsum(t(x))))
    flags = np.array([True, False, True, True])
    assert same_bits(np.cumsum(flags), host(XP.cumsum(t(flags))))          # int64


def test_argsort_stable_argmax_unique_and_counts():
    rng = np.random.default_rng(8)
    keys = rng.integers(0, 7, (4, 40))
    assert same_bits(np.argsort(keys, axis=1, kind="stable"),
                     host(XP.argsort(t(keys), axis=1, kind="stable")))
    mask = keys == 3
    assert same_bits(np.argsort(~mask, axis=1, kind="stable"),
                     host(XP.argsort(XP.logical_not(t(mask)), axis=1, kind="stable")))
    floats = np.array([1.0, np.nan, 5.0, np.nan, 5.0])
    assert int(XP.argmax(t(floats))) == np.argmax(floats) == 1
    assert same_bits(np.argmax(keys, axis=1), host(XP.argmax(t(keys), axis=1)))
    for got, expected in zip(XP.unique(t(keys), return_index=True, return_inverse=True,
                                       return_counts=True),
                             np.unique(keys, return_index=True, return_inverse=True,
                                       return_counts=True)):
        assert same_bits(expected, host(got))


def test_indexing_functions():
    rng = np.random.default_rng(9)
    a = rng.standard_normal((4, 6))
    index = np.argmax(a, axis=1)[:, None]
    assert same_bits(np.take_along_axis(a, index, 1), host(XP.take_along_axis(t(a), t(index), 1)))
    expected, got = np.zeros_like(a), XP.zeros_like(t(a))
    np.put_along_axis(expected, index, 2.5, 1)
    XP.put_along_axis(got, t(index), 2.5, 1)
    assert same_bits(expected, host(got))
    rows, cols = np.array([0, 2]), np.array([1, 3, 5])
    assert same_bits(a[np.ix_(rows, cols)], host(t(a)[XP.ix_(t(rows), t(cols))]))
    picks = np.array([[5, 0], [2, 2]])
    assert same_bits(np.take(a, picks, axis=1), host(XP.take(t(a), t(picks), axis=1)))
    assert same_bits(np.take(a, picks), host(XP.take(t(a), t(picks))))
    assert same_bits(np.delete(a, [1, 3], axis=1), host(XP.delete(t(a), t(np.array([1, 3])), 1)))
    for e, g in zip(np.split(a, [2, 5], axis=1), XP.split(t(a), [2, 5], axis=1)):
        assert same_bits(e, host(g))
    assert XP.count_nonzero(t(a > 0)) == np.count_nonzero(a > 0)


def test_einsum_and_float64_matmul_on_exactly_representable_sums():
    # small integers: every summation order gives the same (exact) result
    rng = np.random.default_rng(10)
    a, b = rng.integers(-50, 50, (7, 9)).astype(np.float64), rng.integers(-50, 50, (9, 5)) * 1.0
    assert same_bits(np.matmul(a, b), host(XP.matmul(t(a), t(b))))
    out = XP.empty((7,), XP.float64)
    assert XP.einsum("pq,pq->p", t(a), t(a), out=out) is out
    assert same_bits(np.einsum("pq,pq->p", a, a), host(out))
    with pytest.raises(ValueError, match="out= has shape"):   # torch would resize it
        XP.add(t(a), 1.0, out=XP.empty((3,), XP.float64))


def test_dtypes_follow_numpy():
    assert XP.zeros(3).dtype == XP.float64 and XP.arange(3).dtype == XP.int64
    assert XP.arange(0.0, 1.0, 0.25).dtype == XP.float64
    assert XP.full(2, 7).dtype == XP.int64 and XP.asarray([1.5]).dtype == XP.float64
    assert XP.divide(t(np.array([1, 2])), 4).dtype == XP.float64
    assert XP.sum(t(np.array([True, True]))).dtype == XP.int64
    assert XP.asarray(t(np.array([True]))).dtype == XP.bool_ and isinstance(np.True_, XP.bool_)
    assert not isinstance(OPS.scalar(1, XP.int64), (XP.generic, XP.integer))
    with pytest.raises(TypeError, match="not callable"):      # as torch.dtype is not
        XP.float32(1.0)
    x = np.float32([0.1, 3.0, 1e-40])
    assert same_bits(x * np.float32(0.1), host(t(x) * 0.1))        # weak Python scalar
    assert same_bits(np.where(x > 1, 0.0, 1.0), host(XP.where(t(x > 1), 0.0, 1.0)))
    assert same_bits(np.sign(specials(np.float64)), host(XP.sign(t(specials(np.float64)))))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernels(dtype):
    x = specials(dtype)
    tx = OPS.asarray(x, dtype)
    assert same_bits(x.view(UINT[dtype]), host(OPS.bits(tx)))
    assert OPS.from_bits(OPS.bits(tx)).dtype == tx.dtype and OPS.size(tx) == x.size
    assert OPS.host_bytes(tx) == x.tobytes() and OPS.to_list(tx[:3]) == x[:3].tolist()
    assert OPS.asarray([0.1]).dtype == XP.float32                   # the container
    wide = random_bits(np.float64, 50_000, 11)
    with np.errstate(over="ignore"):
        narrow = wide[np.isfinite(wide)].astype(np.float32)
    assert same_bits(narrow,
                     host(OPS.astype(OPS.asarray(wide[np.isfinite(wide)], XP.float64), XP.float32)))
    assert OPS.astype(tx, XP.float32 if dtype == np.float64 else XP.float64).dtype != tx.dtype
    assert OPS.astype(tx, tx.dtype, copy=False) is tx
    mask = np.arange(x.size) % 2 == 0
    assert same_bits(np.where(mask, dtype(0), x), host(OPS.zero_where(t(mask), tx)))
    m = OPS.asarray(np.ones((3, 4)), XP.float64)
    assert OPS.is_contiguous(m) and OPS.is_contiguous(m.T, "F") and not OPS.is_contiguous(m.T)
    assert OPS.isdtype(XP.uint32, "unsigned integer") and OPS.isdtype(XP.float64, "real floating")
    first = OPS.scratch("slot", XP.float64, 5)
    assert OPS.scratch("slot", XP.float64, 3).data_ptr() == first.data_ptr()
    with OPS.errstate(over="ignore"):
        assert XP.shares_memory(m[1:], m) and not XP.shares_memory(m, OPS.copy(m))


@pytest.mark.parametrize("fmt", [f for f in builtins() if f.name in ("fp16", "bf16", "fp8_e4m3",
                                                                     "fp8_e5m2", "tf32")],
                         ids=lambda f: f.name)
def test_rounding_and_philox_give_numpys_bits(fmt):
    x = np.concatenate([specials(np.float32), random_bits(np.float32, 20_000, 12)])
    for mode in MODES:
        extra = {"seed": 5, "offset": 2**32 - 3} if mode == "stochastic" else {}
        with np.errstate(all="ignore"):
            expected = round_to(x, fmt, mode, **extra)
        assert same_bits(expected, host(round_to_portable(OPS, t(x), fmt, mode, **extra))), mode
    assert same_bits(philox_uniforms(9, 2**32 - 2, 1000), host(OPS.uniforms(9, 2**32 - 2, 1000)))


def test_an_engine_matmul_gives_numpys_bits_under_every_accumulation_model(backend_name):
    from fpsim.exact.accumulation import matmul
    rng = np.random.default_rng(13)
    a = (rng.standard_normal((6, 33)) * 2.0 ** rng.integers(-20, 20, (6, 33))).astype(np.float32)
    b = rng.standard_normal((33, 5)).astype(np.float32)
    for model in ("exact", "sequential:fp16", "h100"):
        expected = matmul(a, b, out_fmt="fp16", model=model)
        with backend.use_backend(backend_name):
            got = backend.to_numpy(matmul(backend.asarray(a), backend.asarray(b),
                                          out_fmt="fp16", model=model))
        assert same_bits(expected, got), model


def test_a_training_run_gives_numpys_bits(backend_name):
    reference = _train_bits()
    with backend.use_backend(backend_name):
        assert backend.is_array(backend.asarray([1.0])) and backend.name() == backend_name
        assert _train_bits() == reference


def _loop_run(policy, rule):
    """fpsim.train's loop (dynamic loss scaling that backs off and grows, master weights)."""
    from fpsim import nn
    from fpsim.optim import SGD, AdamW, Optimizer
    from fpsim.scaling import preset
    from fpsim.train import make_dataset, train
    data = make_dataset("blobs", n=256, features=8, classes=3, seed=1)
    with use_policy(policy):
        model = nn.MLP([8, 32, 3], rng=1)
        update = SGD(lr=0.05, momentum=0.9) if rule == "sgd" else AdamW(lr=0.01)
        opt = Optimizer(model, update)
    result = train(model, data, optimizer=opt, scaler=preset(
        "torch", init_scale=2.0**20, growth_interval=5), policy=policy, steps=12,
        batch_size=32, seed=1, progress=False)
    return result.loss_hash, result.scaler_state.scale, [r.skipped for r in result.records]


@pytest.mark.parametrize("policy,rule", [("16-mixed", "sgd"), ("bf16-mixed", "adamw"),
                                         ("16-true", "adamw")])
def test_the_training_loop_gives_numpys_bits(policy, rule, backend_name):
    reference = _loop_run(policy, rule)
    with backend.use_backend(backend_name):
        assert _loop_run(policy, rule) == reference


def test_engine_tests_pass_on_torch(backend_name):
    """The engine's own tests (the list numpy-strict runs) under FPSIM_BACKEND=torch (or
    torch:cuda): about 45 s on 2 cores, started at collection (``engine_reruns``)."""
    import engine_reruns
    if backend.name() != "numpy":
        pytest.skip("run once, from the NumPy session")
    returncode, output = engine_reruns.result(backend_name)
    assert returncode == 0, output


def test_division_by_a_scalar_is_one_rounding(backend_name):
    """x / c with c a Python scalar: CUDA computes a * (1/c) for a CPU scalar; the namespace
    puts c on x's device, and the engine divides through xp.divide (numpy-strict refuses the
    operator form). c = 3, 10 and 1e-300 make x * (1/c) differ from x / c for many x."""
    x = np.concatenate([random_bits(np.float64, 20_000, 21), specials(np.float64)])
    x32 = np.concatenate([random_bits(np.float32, 20_000, 22), specials(np.float32)])
    with np.errstate(all="ignore"):
        for c in (3.0, 10.0, 1e-300, 7):
            assert same_bits(x / c, host(XP.divide(t(x), c))), c
            assert same_bits(c / x, host(XP.divide(c, t(x)))), c
            assert same_bits(x32 / np.float32(c), host(XP.divide(t(x32), c))), c
            assert same_bits(x / c, host(t(x) / OPS.scalar(c, XP.float64))), c


def test_tensors_made_from_nothing_go_to_the_backends_device():
    """Every namespace function that makes a tensor without one beside it (and every Python
    scalar meeting a tensor) uses the backend's device. Checked on torch's "meta" device,
    which every CPU has: a CPU tensor of more than one element mixed with a meta tensor is an
    error, and each result must be on meta."""
    meta = TorchBackend("meta")
    meta.activate()
    try:
        xp = meta.xp
        x = xp.zeros(4, xp.float64)
        made = {"zeros": x, "ones": xp.ones((2, 2)), "empty": xp.empty(2),
                "full": xp.full(2, 1.5), "arange": xp.arange(4), "asarray list": xp.asarray([1.0]),
                "asarray host": xp.asarray(np.ones(3)), "array": xp.array([1, 2]),
                "ascontiguousarray": xp.ascontiguousarray(np.ones(2)),
                "asarray cpu tensor": xp.asarray(torch.ones(3)),
                "scalar": meta.scalar(1.0, xp.float32), "scratch": meta.scratch("s", xp.float64, 4),
                "backend asarray": meta.asarray([0.5]), "zeros_like": xp.zeros_like(x),
                "divide": xp.divide(x, 3.0), "divide scalar first": xp.divide(3.0, x),
                "add": xp.add(x, 1.0), "where scalars": xp.where(x > 0, 1.0, 2.0),
                "where": xp.where(x > 0, x, 0.0), "maximum": xp.maximum(x, 0.0),
                "ldexp": xp.ldexp(x, 3), "ldexp host exponents": xp.ldexp(x, np.arange(4)),
                "sqrt": xp.sqrt(x), "sign": xp.sign(x), "spacing": xp.spacing(x),
                "nextafter": xp.nextafter(x, 1.0), "clip": xp.clip(x, 0.0, 1.0),
                "cumsum": xp.cumsum(x), "frexp": xp.frexp(x)[0],
                "bits": meta.bits(meta.asarray([1.0])), "sum": xp.sum(x, axis=0)}
        elsewhere = {name: str(v.device) for name, v in made.items() if v.device.type != "meta"}
        assert elsewhere == {}
    finally:
        TorchBackend().activate()


def test_choosing_a_cuda_backend_without_a_device_says_so():
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    for name in ("torch:cuda", "torch:cuda:1"):
        with pytest.raises(ValueError, match="needs a CUDA device.*CUDA build of PyTorch"):
            backend.set_backend(name)
    assert backend.name() == "numpy"
    with pytest.raises(ValueError, match="accepted: .*torch:cuda:N"):
        backend.set_backend("torch:gpu")


@pytest.mark.gpu
def test_a_cuda_backend_switches_tf32_off(device):
    if device != "cuda":
        pytest.skip("a CUDA test")
    torch.backends.cuda.matmul.allow_tf32 = True
    with backend.use_backend("torch:cuda") as chosen:
        assert not torch.backends.cuda.matmul.allow_tf32
        assert not torch.backends.cudnn.allow_tf32
        assert chosen.versions()["device"] and backend.asarray([1.0]).device.type == "cuda"


def test_fpsim_train_on_the_backend_gives_numpys_trace_and_names_it(backend_name, tmp_path,
                                                                     capsys):
    import json

    from fpsim.cli import main
    command = ["train", "--data", "blobs", "--samples", "128", "--hidden", "8", "--steps", "6",
               "--quiet", "--out"]
    assert main([*command, str(tmp_path / "numpy")]) == 0
    assert main([*command, str(tmp_path / "torch"), "--backend", backend_name]) == 0
    assert json.loads((tmp_path / "torch" / "run.json").read_text())["backend"] == backend_name
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "numpy"), str(tmp_path / "torch")]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("bit-identical: 6 steps") and f"backend {backend_name})" in shown
    assert f"backend: 'numpy' | '{backend_name}'" in shown


QUICK_SUBSET = "underflow,master_weights,accumulation"     # the cheapest three on torch


def _reproduced_bytes(out, backend_name=None, only=QUICK_SUBSET) -> dict:
    from fpsim.cli import main
    command = ["reproduce", "--quick", "--quiet", "--out", str(out)]
    command += ["--only", only] if only else []
    assert main(command + (["--backend", backend_name] if backend_name else [])) == 0
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())
            if p.suffix == ".svg" or p.name in ("summary.json", "summary.md")}


def test_reproduce_on_the_backend_writes_numpys_bytes(backend_name, tmp_path):
    """summary.json, summary.md and the SVGs of `fpsim reproduce --quick --backend torch`
    are NumPy's bytes (three experiments here; all of them in the slow test below)."""
    import json
    expected = _reproduced_bytes(tmp_path / "numpy")
    assert len(expected) == 5 and _reproduced_bytes(tmp_path / "torch", backend_name) == expected
    timings = json.loads((tmp_path / "torch" / "timings.json").read_text())
    assert timings["backend"] == backend_name and "torch" in timings["versions"]


@pytest.mark.slow
def test_every_quick_experiment_on_the_backend_writes_numpys_bytes(backend_name, tmp_path):
    """The whole of `fpsim reproduce --quick` (about 20 s on NumPy, 2 minutes on torch CPU
    on 2 cores)."""
    expected = _reproduced_bytes(tmp_path / "numpy", only=None)
    assert _reproduced_bytes(tmp_path / "torch", backend_name, only=None) == expected
