"""Learning-rate schedules (fpsim.optim.schedules) against torch.optim.lr_scheduler, float
for float, over hundreds of steps; their strings, records and refusals."""
import math

import pytest

from fpsim.optim.schedules import (Cosine, Linear, OneCycle, StepLR, WarmupCosine,
                                   parse_schedule, schedule_from_record)

torch = pytest.importorskip("torch")
lr_scheduler = torch.optim.lr_scheduler


def torch_lrs(make, steps: int, base_lr: float) -> list:
    """The lr of each of ``steps`` optimizer steps under the scheduler ``make(optimizer)``
    builds, in torch's order: optimizer.step(), then scheduler.step()."""
    weight = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.SGD([weight], lr=base_lr, momentum=0.9)
    scheduler = make(optimizer)
    lrs = []
    for step in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        if step < steps - 1:
            scheduler.step()
    return lrs


BASES = (0.1, 0.05, 3e-4, 0.7)

CASES = [
    (StepLR(30, 0.1), lambda o: lr_scheduler.StepLR(o, 30, 0.1)),
    (StepLR(7, 0.5), lambda o: lr_scheduler.StepLR(o, 7, 0.5)),
    (StepLR(1, 0.97), lambda o: lr_scheduler.StepLR(o, 1, 0.97)),
    (Cosine(100), lambda o: lr_scheduler.CosineAnnealingLR(o, 100)),
    (Cosine(50, 1e-4), lambda o: lr_scheduler.CosineAnnealingLR(o, 50, 1e-4)),
    (Cosine(17, 0.003), lambda o: lr_scheduler.CosineAnnealingLR(o, 17, 0.003)),
    (Cosine(1), lambda o: lr_scheduler.CosineAnnealingLR(o, 1)),
    (Linear(), lambda o: lr_scheduler.LinearLR(o)),
    (Linear(0.01, 1.0, 100), lambda o: lr_scheduler.LinearLR(o, 0.01, 1.0, 100)),
    (Linear(1.0, 0.0, 50), lambda o: lr_scheduler.LinearLR(o, 1.0, 0.0, 50)),
    (Linear(0.25, 0.75, 37), lambda o: lr_scheduler.LinearLR(o, 0.25, 0.75, 37)),
    (WarmupCosine(10, 200), lambda o: lr_scheduler.SequentialLR(
        o, [lr_scheduler.LinearLR(o, 1.0 / 3, 1.0, 10),
            lr_scheduler.CosineAnnealingLR(o, 200)], milestones=[10])),
    (WarmupCosine(25, 90, 0.001, 1e-5), lambda o: lr_scheduler.SequentialLR(
        o, [lr_scheduler.LinearLR(o, 0.001, 1.0, 25),
            lr_scheduler.CosineAnnealingLR(o, 90, 1e-5)], milestones=[25])),
]


@pytest.mark.parametrize("base_lr", BASES)
@pytest.mark.parametrize("case", range(len(CASES)), ids=lambda i: str(CASES[i][0]))
def test_schedules_give_torchs_learning_rates(case, base_lr):
    ours, make = CASES[case]
    expected = torch_lrs(make, 400, base_lr)
    got = ours.lrs(400, base_lr)
    assert got == expected and all(type(lr) is float for lr in got)
    assert [ours.lr_at(k, base_lr) for k in (0, 1, 99, 399)] == [expected[k] for k in
                                                                (0, 1, 99, 399)]


ONE_CYCLES = [
    dict(total_steps=300, max_lr=0.1),
    dict(total_steps=250, max_lr=0.02, pct_start=0.25, anneal_strategy="linear"),
    dict(total_steps=401, max_lr=1.0, three_phase=True, div_factor=10.0,
         final_div_factor=100.0),
    dict(total_steps=100, max_lr=0.3, pct_start=0.0),
    dict(total_steps=3, max_lr=0.5, pct_start=0.5),
]


@pytest.mark.parametrize("settings", ONE_CYCLES, ids=str)
def test_onecycle_gives_torchs_learning_rates_to_its_last_step(settings):
    total = settings["total_steps"]
    expected = torch_lrs(lambda o: lr_scheduler.OneCycleLR(o, cycle_momentum=False,
                                                           **settings), total + 1, 0.123)
    ours = OneCycle(**settings)
    assert ours.lrs(total + 1, 0.123) == expected
    default_peak = OneCycle(**{k: v for k, v in settings.items() if k != "max_lr"})
    assert default_peak.lrs(total + 1, settings["max_lr"]) == expected   # max_lr: the rule's
    with pytest.raises(ValueError, match=f"steps 0 to {total} only"):
        ours.lr_at(total + 1, 0.1)


def test_the_recursive_form_is_not_the_closed_form():
    """What the schedules are for: torch's chainable arithmetic, which the textbook formula
    misses in the last bits (so a closed-form schedule would not reproduce torch)."""
    base = 0.1
    closed = [0.5 * base * (1 + math.cos(math.pi * k / 100)) for k in range(100)]
    ours = Cosine(100).lrs(100, base)
    assert ours != closed and max(abs(a - b) for a, b in zip(ours, closed)) < 1e-15
    steps = [base * 0.1 ** (k // 30) for k in range(300)]
    assert StepLR(30).lrs(300, base) != steps


@pytest.mark.parametrize("schedule", [case[0] for case in CASES] + [OneCycle(**ONE_CYCLES[2]),
                                                                    OneCycle(100)])
def test_strings_and_records_read_back_to_the_same_schedule(schedule):
    assert parse_schedule(str(schedule)) == schedule
    assert schedule_from_record(schedule.record()) == schedule
    assert schedule.record()["schedule"] == str(schedule).partition(":")[0]


def test_parse_reads_the_grammar():
    assert parse_schedule("cosine:t_max=100,eta_min=0") == Cosine(100, 0.0)
    assert parse_schedule(" step:step_size=5 ") == StepLR(5, 0.1)
    assert parse_schedule("linear") == Linear()
    assert parse_schedule("onecycle:total_steps=10,max_lr=none,three_phase=TRUE") == \
        OneCycle(10, None, three_phase=True)
    assert parse_schedule("warmup_cosine:warmup=5,t_max=95,start_factor=0.1") == \
        WarmupCosine(5, 95, 0.1)


@pytest.mark.parametrize("text,message", [
    ("cosin:t_max=3", "schedule 'cosin:t_max=3': unknown schedule 'cosin'; did you mean "
                      "'cosine'? accepted: step, cosine, linear, onecycle, warmup_cosine"),
    ("cosine", "schedule 'cosine': cosine needs t_max (cosine:t_max=...)"),
    ("cosine:t_max=0", "schedule 'cosine:t_max=0': t_max must be a positive integer, got 0"),
    ("cosine:t_max=1.5", "schedule 'cosine:t_max=1.5': t_max must be an integer, got '1.5'"),
    ("cosine:t_max=10,t_max=20", "schedule 'cosine:t_max=10,t_max=20': sets 't_max' twice"),
    ("cosine:t_max", "schedule 'cosine:t_max': 't_max' needs a value (t_max=...)"),
    ("cosine:t_max=9,eta_min=-1", "eta_min must be a number >= 0, got -1.0"),
    ("cosine:t_max=9,eta_min=nan", "eta_min must be finite"),
    ("step:step_size=3,gamma=x", "gamma must be a number, got 'x'"),
    ("step:size=3", "unknown step key 'size'"),
    ("linear:start_factor=0", "start_factor must be a number in (0, 1], got 0.0"),
    ("linear:end_factor=2", "end_factor must be a number in [0, 1], got 2.0"),
    ("onecycle:total_steps=10,anneal_strategy=cosine",
     "unknown anneal_strategy 'cosine'; did you mean 'cos'?"),
    ("onecycle:total_steps=10,three_phase=yes", "unknown three_phase value 'yes'"),
    ("onecycle:total_steps=10,pct_start=0.1", "pct_start=0.1 with total_steps=10 makes "
                                              "phase 1 of the cycle zero steps long"),
    ("onecycle:total_steps=10,max_lr=0", "max_lr must be a number > 0, got 0.0"),
    ("warmup_cosine:t_max=5", "warmup_cosine needs warmup"),
])
def test_parse_refuses_in_one_sentence(text, message):
    with pytest.raises(ValueError) as caught:
        parse_schedule(text)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert str(caught.value).startswith(f"schedule {text!r}: ")


@pytest.mark.parametrize("call,error,message", [
    (lambda: parse_schedule(3), TypeError, "schedule must be a string"),
    (lambda: Cosine(t_max=True), TypeError, "t_max must be a positive integer, got True"),
    (lambda: StepLR(5, gamma="0.5"), TypeError, "gamma must be a real number"),
    (lambda: OneCycle(10, three_phase=1), TypeError, "three_phase must be True or False"),
    (lambda: Cosine(10).lrs(-1, 0.1), ValueError, "steps must be an integer >= 0"),
    (lambda: Cosine(10).lr_at(2.0, 0.1), TypeError, "step must be an integer >= 0"),
    (lambda: Cosine(10).lrs(3, 0.0), ValueError, "base_lr must be a number > 0"),
    (lambda: schedule_from_record({"schedule": "cosine", "t_max": 3, "tmax": 4}),
     ValueError, "unknown keys ['tmax']"),
    (lambda: schedule_from_record({"t_max": 3}), TypeError, "unknown schedule None"),
    (lambda: schedule_from_record("cosine"), TypeError, "schedule record must be a dict"),
])
def test_schedules_refuse_bad_arguments(call, error, message):
    with pytest.raises(error) as caught:
        call()
    assert message in str(caught.value)
