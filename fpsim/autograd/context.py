"""The engine's ambient state: the current precision policy and whether graphs are recorded.

Both are per thread and nest like PyTorch's ``torch.autocast`` and ``torch.no_grad``:

>>> from fpsim.autograd import use_policy, current_policy, no_grad, is_grad_enabled
>>> with use_policy("16-mixed"):
...     current_policy().name
'16-mixed'
>>> current_policy().name
'32-true'
>>> with no_grad():
...     is_grad_enabled()
False
"""
from __future__ import annotations

import threading
from contextlib import contextmanager

from .policy import Policy, get_policy

__all__ = ["current_policy", "use_policy", "set_default_policy", "no_grad", "enable_grad",
           "is_grad_enabled"]


class _State(threading.local):
    def __init__(self) -> None:
        self.policies: list[Policy] = []
        self.grad_enabled = True


_state = _State()
_default = [get_policy("32-true")]


def current_policy() -> Policy:
    """The innermost ``use_policy`` policy, or the default ("32-true" unless changed)."""
    return _state.policies[-1] if _state.policies else _default[0]


def set_default_policy(policy) -> Policy:
    """Set the policy used outside every ``use_policy`` block; returns the previous default."""
    previous, _default[0] = _default[0], get_policy(policy)
    return previous


@contextmanager
def use_policy(policy):
    """Run a block under ``policy`` (a ``Policy`` or any string ``get_policy`` accepts).

    The policy decides the formats of ops *run* in the block, and of parameters *created* in it;
    each tensor remembers its own formats, so a backward pass run later rounds as its forward
    pass was set up.
    """
    _state.policies.append(get_policy(policy))
    try:
        yield _state.policies[-1]
    finally:
        _state.policies.pop()


def is_grad_enabled() -> bool:
    return _state.grad_enabled


@contextmanager
def _grad_mode(enabled: bool):
    previous, _state.grad_enabled = _state.grad_enabled, enabled
    try:
        yield
    finally:
        _state.grad_enabled = previous


def no_grad():
    """Ops in this block record no graph: their outputs do not require grad."""
    return _grad_mode(False)


def enable_grad():
    """Record graphs again inside a ``no_grad`` block."""
    return _grad_mode(True)
