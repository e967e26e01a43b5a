"""fpsim.nn: parameters, state dicts, seeded initialisation, layers."""
import numpy as np
import pytest

import fpsim.autograd as ag
from fpsim import backend, nn, round_to
from fpsim.autograd import Tensor, use_policy
from fpsim.formats import BF16, FP16, FP32


def test_named_parameters_order_and_sharing():
    model = nn.MLP([3, 4, 4, 2], rng=0)
    names = [n for n, _ in model.named_parameters()]
    assert names == ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]
    assert model.num_parameters() == 3 * 4 + 4 + 4 * 4 + 4 + 4 * 2 + 2

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(2, 2, rng=1)
            self.b = nn.Linear(2, 2, rng=2)
            self.b.weight = self.a.weight

    assert [n for n, _ in Tied().named_parameters()] == ["a.weight", "a.bias", "b.bias"]


def test_same_seed_same_bits_different_seed_different_values():
    a, b, c = (nn.MLP([5, 7, 3], rng=s) for s in (11, 11, 12))
    for (_, pa), (_, pb), (_, pc) in zip(a.named_parameters(), b.named_parameters(),
                                         c.named_parameters()):
        pa, pb, pc = (backend.to_numpy(p.data) for p in (pa, pb, pc))
        np.testing.assert_array_equal(pa.view(np.uint32), pb.view(np.uint32))
        assert not np.array_equal(pa, pc)
    bound = 1 / np.sqrt(5)
    assert np.all(np.abs(backend.to_numpy(a[0].weight.data)) <= bound)


def test_parameters_created_in_the_policy_param_format():
    with use_policy("bf16-true"):
        layer = nn.Linear(8, 4, rng=0)
    assert layer.weight.fmt == BF16 and layer.weight.requires_grad
    w = backend.to_numpy(layer.weight.data)
    assert np.array_equal(round_to(w, BF16), w)
    with use_policy("16-mixed"):
        assert nn.Linear(8, 4, rng=0).weight.fmt == FP32


def test_state_dict_round_trip_and_errors():
    src, dst = nn.MLP([3, 5, 2], rng=0), nn.MLP([3, 5, 2], rng=1)
    state = src.state_dict()
    state["0.weight"][0, 0] = 123.0       # a copy: the model is unchanged
    assert backend.to_numpy(src[0].weight.data)[0, 0] != 123.0
    dst.load_state_dict(src.state_dict())
    for (_, p), (_, q) in zip(src.named_parameters(), dst.named_parameters()):
        np.testing.assert_array_equal(backend.to_numpy(p.data), backend.to_numpy(q.data))
    with pytest.raises(KeyError, match="missing keys.*unexpected keys"):
        dst.load_state_dict({"0.weight": np.zeros((5, 3)), "x": np.zeros(1)})
    with pytest.raises(ValueError, match=r"'0.bias' has shape \(4,\)"):
        dst.load_state_dict({**src.state_dict(), "0.bias": np.zeros(4)})
    with use_policy("16-true"):
        half = nn.MLP([3, 5, 2], rng=0)
    half.load_state_dict({k: v + 1e-4 for k, v in src.state_dict().items()})
    w = backend.to_numpy(half[0].weight.data)
    assert np.array_equal(round_to(w, FP16), w)


def test_module_zero_grad_and_training_step_reduces_loss():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 4))
    labels = (x[:, 0] > 0).astype(int)
    model = nn.MLP([4, 16, 2], activation="gelu", rng=3)
    losses = []
    for _ in range(30):
        model.zero_grad()
        with use_policy("16-mixed"):
            loss = ag.cross_entropy(model(Tensor(x)), labels)
            loss.backward()
        losses.append(loss.item())
        for p in model.parameters():
            step = backend.scalar(0.5, backend.xp.float32) * p.grad.data
            p.data = backend.round_to(p.data - step, p.fmt)
    assert losses[-1] < 0.5 * losses[0]


def test_embedding_forward_backward_with_repeated_indices():
    emb = nn.Embedding(5, 3, rng=0)
    out = emb(np.array([[1, 4], [1, 1]]))
    assert out.shape == (2, 2, 3)
    np.testing.assert_array_equal(backend.to_numpy(out.data)[1, 0],
                                  backend.to_numpy(emb.weight.data)[1])
    out.sum().backward()
    np.testing.assert_array_equal(backend.to_numpy(emb.weight.grad.data)[:, 0], [0, 3, 0, 0, 1])
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        emb(np.array([5]))
    with pytest.raises(TypeError, match="integer indices"):
        emb(np.array([0.5]))


def test_lstm_shapes_state_and_errors():
    lstm = nn.LSTM(3, 4, rng=0)
    assert [n for n, _ in lstm.named_parameters()] == ["weight_ih", "weight_hh", "bias_ih",
                                                        "bias_hh"]
    x = Tensor(np.random.default_rng(0).standard_normal((2, 5, 3)))
    out, (h, c) = lstm(x)
    np.testing.assert_array_equal(backend.to_numpy(out.data)[:, -1], backend.to_numpy(h.data))
    out2, _ = lstm(x[:, 2:], state=lstm(x[:, :2])[1])
    np.testing.assert_allclose(backend.to_numpy(out2.data), backend.to_numpy(out.data)[:, 2:],
                               rtol=1e-6)
    with pytest.raises(ValueError, match=r"input \(batch, time, 3\)"):
        lstm(Tensor(np.ones((2, 3))))


def test_mlp_builder_validation():
    with pytest.raises(ValueError, match="at least two sizes"):
        nn.MLP([3])
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        nn.MLP([3, 2], activation="swish")
    with pytest.raises(TypeError, match="rng must be"):
        nn.Linear(2, 2, rng="seed")
