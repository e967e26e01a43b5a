"""Speed settings change no bit: every exact/ computation under the backend settings that force
its other paths (tiny chunks, thresholds at both ends: ``fpsim.backend.use_tuning``) gives the
bits of the default settings."""
from __future__ import annotations

import numpy as np
import pytest

from fpsim import backend
from fpsim.exact import (cr_exp, cr_gelu, cr_log_softmax, exact_matmul, exact_rows_sum,
                         global_norm, matmul, matmul_2d, reduce_sum, round_to_odd_sum)
from fpsim.formats import BF16, FP16, FP32
from bit_patterns import same_bits
from test_fastpaths import adversarial

# every exact/ setting at a small or extreme value: many chunks, lines crossing them, each
# path of each threshold taken (the defaults take the broadcast outer product, SMALL the one
# width per chunk, LARGE the chunk taken again with each element's width)
SMALL = dict(certificate_chunk=7, certificate_open_chunk=37, einsum_from=1, recheck_share=1,
             certified_block=5, certified_pattern_block=3, correctly_rounded_chunk=11,
             widen_chunk=13, plain_factor=1, exact_min_saving=-10 ** 9, dot_from=1,
             support=10 ** 6, probes=1, sparse_from=0, norm_chunk=17, sums_chunk=29)
LARGE = dict(certificate_open_chunk=1 << 30, einsum_from=1, recheck_share=10 ** 9,
             dot_from=10 ** 9, support=0, probes=10 ** 6, sparse_from=10 ** 9,
             exact_min_saving=10 ** 9)


def _computations(kind):
    """(name, thunk) pairs over one data set of ``kind`` (test_fastpaths.adversarial)."""
    rng = np.random.default_rng(len(kind))
    a, b, bias = adversarial(rng, 23, 40, 17, kind)
    a[3, ::2] = 0.0                            # sparse rows: the zero-sum support test
    b[:, 5] = -0.0
    x = np.concatenate([a, -a[:, :7]], axis=1)     # cancelling rows for the sums
    t = rng.standard_normal((40, 9)) * 2.0 ** rng.integers(-300, 300, (40, 9))
    y = rng.standard_normal(300) * 2.0 ** rng.integers(-12, 6, 300)
    out = []
    for fmt in (FP32, BF16, FP16):
        out += [(f"matmul {fmt.name}", lambda f=fmt: matmul(a, b, out_fmt=f)),
                (f"matmul F {fmt.name}", lambda f=fmt: matmul(np.asfortranarray(a), b,
                                                               out_fmt=f)),
                (f"matmul_2d bias {fmt.name}", lambda f=fmt: matmul_2d(a, b, f, bias)),
                (f"reduce_sum 0 {fmt.name}", lambda f=fmt: reduce_sum(x, 0, out_fmt=f)),
                (f"reduce_sum 1 {fmt.name}", lambda f=fmt: reduce_sum(x, 1, out_fmt=f))]
    out += [("exact_matmul fp16", lambda: exact_matmul(a[None], b[None], FP16)[0]),
            ("exact_rows_sum", lambda: exact_rows_sum(x, FP32)[0]),
            ("round_to_odd_sum", lambda: round_to_odd_sum(t)),
            ("global_norm", lambda: np.float32(global_norm([a, b, bias]))),
            ("cr_exp", lambda: cr_exp(y, BF16)),
            ("cr_gelu", lambda: cr_gelu(y, FP16)),
            ("cr_log_softmax", lambda: cr_log_softmax(y.reshape(20, 15), 1, BF16))]
    return out


@pytest.mark.parametrize("settings", [SMALL, LARGE], ids=["small", "large"])
@pytest.mark.parametrize("kind", ["fp16", "wide", "ints", "tiny", "huge"])
def test_speed_settings_change_no_bit(kind, settings):
    with np.errstate(over="ignore", invalid="ignore"):
        for name, compute in _computations(kind):
            want = backend.to_numpy(compute())
            with backend.use_tuning(**settings):
                got = backend.to_numpy(compute())
            assert same_bits(got, want), (kind, name)


def test_use_tuning_is_undone():
    before = backend.tuning()
    with backend.use_tuning(**SMALL):
        assert backend.tuning().widen_chunk == 13
    assert backend.tuning() == before
