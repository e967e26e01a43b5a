"""The optimizer's chain made open: the user's own transforms (``Optimizer(extra=)``) and the
learning rate changed between steps (``set_learning_rate``, what a schedule drives), each
bit for bit what the equivalent optimizer built from scratch does."""
import dataclasses
from dataclasses import dataclass

import numpy as np
import pytest

from fpsim import backend
from fpsim.autograd import Tensor
from fpsim.optim import SGD, Adam, AdamW, Optimizer
from fpsim.optim.schedules import Cosine

from bit_patterns import host, same_bits

xp = backend.xp


def parameters(shapes, fmt="fp32", seed=0):
    rng = np.random.default_rng(seed)
    return [(f"p{i}", Tensor(rng.standard_normal(shape).astype(np.float32), fmt,
                             requires_grad=True)) for i, shape in enumerate(shapes)]


def gradients(named, steps, seed=1):
    rng = np.random.default_rng(seed)
    return [[(rng.standard_normal(p.shape) * 2.0 ** rng.integers(-8, 2)).astype(np.float32)
             for _, p in named] for _ in range(steps)]


def run(optimizer, named, grads, before_step=lambda k: None):
    for k, step_grads in enumerate(grads):
        for (_, p), g in zip(named, step_grads):
            p.grad = Tensor(g, "fp32")
        before_step(k)
        optimizer.step()
    return snapshot(optimizer, named)


def snapshot(optimizer, named):
    arrays = [host(p.data) for _, p in named]
    arrays += [host(v) for v in optimizer.state_dict().values()]
    return arrays


def same(a, b) -> bool:
    return len(a) == len(b) and all(same_bits(x, y) for x, y in zip(a, b))


# --- extra transforms ------------------------------------------------------------------------
@dataclass(frozen=True)
class ZeroGradientOf:
    """Freezes one named parameter: its gradient zeroed (which parameter, from init)."""

    name: str

    def init(self, named):
        return tuple(n == self.name for n, _ in named)

    def update(self, step, state, params):
        grads = tuple(xp.zeros_like(g) if zeroed else g for g, zeroed in zip(step.grads, state))
        return step._replace(grads=grads), state


@dataclass(frozen=True)
class GradientNoise:
    """Adds seeded Gaussian noise (scale ``sigma``) to every gradient; the state counts the
    steps, so a step's noise depends on the seed and the step only."""

    seed: int
    sigma: float

    def init(self, named):
        return 0

    def update(self, step, state, params):
        rng = np.random.default_rng([self.seed, state])
        grads = tuple(g + xp.asarray((rng.standard_normal(g.shape) * self.sigma)
                                     .astype(np.float32)) for g in step.grads)
        return step._replace(grads=grads), state + 1


SHAPES = [(3, 4), (4,), (2, 2), (5,)]          # small: the plain chain joins them in one pass


@pytest.mark.parametrize("master", ["fp32", None])
def test_an_extra_transform_that_zeroes_a_gradient_freezes_that_parameter(master):
    named, plain = parameters(SHAPES), parameters(SHAPES)
    grads = gradients(named, 4)
    extended = Optimizer(named, SGD(lr=0.1, momentum=0.9), master=master,
                         extra=(ZeroGradientOf("p1"),))
    reference = Optimizer(plain, SGD(lr=0.1, momentum=0.9), master=master)
    assert extended.together_format() is None and reference.together_format() is not None
    frozen = host(named[1][1].data).copy()
    run(extended, named, grads)
    run(reference, plain, grads)
    assert same_bits(host(named[1][1].data), frozen)
    assert not same_bits(host(plain[1][1].data), frozen)
    for i in (0, 2, 3):                       # the others exactly as without the transform
        assert same_bits(host(named[i][1].data), host(plain[i][1].data))
    kinds = [type(t).__name__ for t in extended.transform.transforms]
    assert kinds.index("ZeroGradientOf") == kinds.index("MeasureGlobalNorm") + 1
    assert kinds.index("CheckGradients") + 1 == kinds.index("ApplyRule")


def test_seeded_gradient_noise_is_reproducible_and_takes_effect():
    results = []
    for extra in ((GradientNoise(7, 1e-2),), (GradientNoise(7, 1e-2),), ()):
        named = parameters(SHAPES)
        results.append(run(Optimizer(named, Adam(lr=1e-2), extra=extra), named,
                           gradients(named, 5)))
    assert same(results[0], results[1]) and not same(results[0], results[2])


def test_an_extra_transform_may_skip_the_step():
    @dataclass(frozen=True)
    class SkipAll:
        def init(self, named):
            return ()

        def update(self, step, state, params):
            return step._replace(skipped=True), state

    named = parameters(SHAPES)
    optimizer = Optimizer(named, SGD(lr=0.1, momentum=0.9), extra=[SkipAll()])
    before = snapshot(optimizer, named)
    run(optimizer, named, gradients(named, 2))
    assert optimizer.step_count == 0 and same(snapshot(optimizer, named), before)


@pytest.mark.parametrize("extra,message", [
    ("noise", "extra must be a tuple of transforms (objects with init(named) and update(step, "
              "state, params)), got str 'noise'"),
    ((ZeroGradientOf,), "extra[0] must be a transform (an object with init(named) and "
                        "update(step, state, params), such as MyTransform(), not the class), "
                        "got the class ZeroGradientOf"),
    ((ZeroGradientOf("p0"), object()), "extra[1] must be a transform"),
    (ZeroGradientOf("p0"), "extra must be a tuple of transforms"),
])
def test_extra_must_be_transforms(extra, message):
    with pytest.raises(TypeError) as caught:
        Optimizer(parameters(SHAPES), SGD(lr=0.1), extra=extra)
    assert message in str(caught.value)


@dataclass(frozen=True)
class Returns:
    """A faulty transform: ``result(step, state)`` is what its update returns."""

    result: object

    def init(self, named):
        return ()

    def update(self, step, state, params):
        return self.result(step, state)


@pytest.mark.parametrize("result,message", [
    (lambda step, state: step, "Returns.update must return a pair (step, state) with step "
                               "a StepData (step._replace(...)), got StepData"),
    (lambda step, state: (step.grads, state), "with step a StepData (step._replace(...)), "
                                              "got (tuple, tuple)"),
    (lambda step, state: (step._replace(grads=step.grads[:1]), state),
     "step.grads a tuple of 2 float32 arrays of the parameters' shapes [(3, 4), (4,)], got "
     "(float32[3, 4])"),
    (lambda step, state: (step._replace(grads=tuple(xp.asarray(g, xp.float64)
                                                    for g in step.grads)), state),
     "got (float64[3, 4], float64[4])"),
])
def test_a_faulty_extra_transform_is_named_before_any_weight_changes(result, message):
    named = parameters(SHAPES[:2])
    optimizer = Optimizer(named, SGD(lr=0.1), extra=(Returns(result),))
    before = snapshot(optimizer, named)
    for _, p in named:
        p.grad = Tensor(np.ones(p.shape, np.float32), "fp32")
    with pytest.raises(TypeError) as caught:
        optimizer.step()
    assert message in str(caught.value)
    assert same(snapshot(optimizer, named), before) and optimizer.step_count == 0


# --- set_learning_rate -----------------------------------------------------------------------
RULES = [SGD(lr=0.1), SGD(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3),
         Adam(lr=1e-2), AdamW(lr=1e-2, weight_decay=0.05)]
LAYOUTS = {"together": SHAPES, "one by one": [(300, 40), (7,)]}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("master,fmt", [("fp32", "fp32"), ("fp32", "bf16"), (None, "fp16")])
@pytest.mark.parametrize("rule", RULES, ids=repr)
def test_set_learning_rate_steps_as_an_optimizer_built_with_that_lr(rule, master, fmt, layout):
    """Set before the first step: the very bits of an optimizer built with the new lr; set
    after two steps: the bits of one built with it that loads the first's checkpoint (the
    learning rate is no checkpoint array)."""
    shapes, new_lr = LAYOUTS[layout], 0.0371
    named = parameters(shapes, fmt)
    grads = gradients(named, 5)
    changed = Optimizer(named, rule, master=master)
    changed.set_learning_rate(new_lr)
    built = parameters(shapes, fmt)
    assert same(run(changed, named, grads),
                run(Optimizer(built, dataclasses.replace(rule, lr=new_lr), master=master),
                    built, grads))
    assert changed.rule == dataclasses.replace(rule, lr=new_lr)
    assert changed.learning_rate == new_lr

    named, resumed = parameters(shapes, fmt), parameters(shapes, fmt)
    midway = Optimizer(named, rule, master=master)
    run(midway, named, grads[:2])
    checkpoint = midway.state_dict()
    midway.set_learning_rate(new_lr)
    for (_, p), (_, q) in zip(named, resumed):
        q.data = backend.copy(p.data)
    loaded = Optimizer(resumed, dataclasses.replace(rule, lr=new_lr), master=master)
    loaded.load_state_dict(checkpoint)
    assert same(run(midway, named, grads[2:]), run(loaded, resumed, grads[2:]))


def test_a_zero_learning_rate_advances_the_states_and_keeps_the_weights():
    named = parameters(SHAPES)
    optimizer = Optimizer(named, SGD(lr=0.1, momentum=0.9))
    run(optimizer, named, gradients(named, 1))
    optimizer.set_learning_rate(0)
    before = snapshot(optimizer, named)
    run(optimizer, named, gradients(named, 1, seed=3))
    after = snapshot(optimizer, named)
    assert optimizer.step_count == 2 and optimizer.rule.lr == 0.0
    assert same(after[:len(named)], before[:len(named)]) and not same(after, before)
    optimizer.set_learning_rate(0.5)                     # and back
    assert optimizer.rule == SGD(lr=0.5, momentum=0.9)


@pytest.mark.parametrize("lr,error,message", [
    ("0.1", TypeError, "lr must be a real number (a number >= 0), got str '0.1'"),
    (True, TypeError, "lr must be a real number"),
    (-0.1, ValueError, "lr must be a number >= 0, got -0.1"),
    (float("inf"), ValueError, "lr must be finite"),
    (1e-50, ValueError, "lr=1e-50 is 0.0 in float32"),
])
def test_set_learning_rate_refuses_what_no_rule_can_use(lr, error, message):
    named = parameters(SHAPES)
    optimizer = Optimizer(named, SGD(lr=0.1))
    with pytest.raises(error) as caught:
        optimizer.set_learning_rate(lr)
    assert message in str(caught.value) and optimizer.rule == SGD(lr=0.1)


def test_the_rule_cannot_be_replaced_silently():
    """``opt.rule = replace(opt.rule, lr=...)`` used to raise nothing and change nothing."""
    named = parameters(SHAPES)
    optimizer = Optimizer(named, SGD(lr=0.1))
    with pytest.raises(AttributeError, match=r"call set_learning_rate\(lr\) to change the "
                                             r"learning rate"):
        optimizer.rule = dataclasses.replace(optimizer.rule, lr=0.5)
    assert optimizer.rule == SGD(lr=0.1)

    @dataclass(frozen=True)
    class NoLearningRate:
        def init(self, param):
            return SGD(lr=1.0).init(param)

        def apply(self, ops, param, grad, state, step):
            return SGD(lr=1.0).apply(ops, param, grad, state, step)

    with pytest.raises(TypeError, match="set_learning_rate needs a rule with an lr field"):
        Optimizer(named, NoLearningRate()).set_learning_rate(0.5)


def test_a_schedule_driven_run_is_torchs_run_with_its_scheduler():
    """SGD with momentum under cosine annealing, lr reaching 0 at t_max and climbing again:
    the weights bit for bit torch's (SGD matches torch.optim.SGD; the schedule its lrs)."""
    torch = pytest.importorskip("torch")
    fused = (-torch.ones(64)).add_(torch.full((64,), 1 + 2 ** -23),
                                   alpha=1 - 2 ** -23)        # torch's CPU kernels fuse this
    if not bool((fused == -2.0 ** -46).all()):
        pytest.skip("torch CPU kernels without FMA")
    named = parameters([(257,)])
    grads = gradients(named, 14)
    start = host(named[0][1].data).copy()
    optimizer = Optimizer(named, SGD(lr=0.2, momentum=0.9))
    lrs = Cosine(t_max=10).lrs(len(grads), 0.2)
    assert lrs[10] == 0.0
    ours = run(optimizer, named, grads, lambda k: optimizer.set_learning_rate(lrs[k]))[0]

    weight = torch.nn.Parameter(torch.from_numpy(start))
    theirs = torch.optim.SGD([weight], lr=0.2, momentum=0.9, foreach=False)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(theirs, T_max=10)
    for step_grads in grads:
        weight.grad = torch.from_numpy(step_grads[0].copy())
        theirs.step()
        scheduler.step()
    assert same_bits(ours, weight.detach().numpy())
