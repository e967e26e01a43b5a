"""``Tensor``: values in a format, a gradient in a format, and the graph for reverse-mode autodiff.

A tensor holds ``data`` (a backend array: float32 container for every fpsim ``Format``, float64
in the reference mode), its ``fmt``, and ``grad_fmt``, the format its gradient is stored in
(the policy's ``grad`` when set, else ``fmt``: a gradient flowing into an fp16 activation is an
fp16 value and underflows where a real fp16 backward pass would).

Every op goes through one dispatch point, ``record(data, fmt, parents, backward, op)``: it wraps
the op's (already rounded) output and, when grad mode is on and a parent requires grad, keeps
the parents and the op's ``backward(g, g_fmt)`` closure, which returns one gradient per parent
(``None`` for parents that need none), each already rounded to that parent's ``grad_fmt``.

The ops (``ops_*.py``) import this module, never the other way round: each ops module hands
its functions to ``register`` when it is imported (``fpsim.autograd`` imports them all), and
``Tensor``'s operators and methods (``x + y``, ``x.sum()``, ...) call the registered function
of that name.

``Tensor.backward`` walks the graph in reverse topological order::

    grads = {root: seed rounded to root.grad_fmt}
    for node in reversed(topological_order(root)):
        g = grads.pop(node)
        if node is a leaf:                node.grad = round(node.grad + g, node.grad_fmt)
        else: for parent, gp in zip(node.parents, node.backward(g, node.grad_fmt)):
                  grads[parent] = gp  if parent not in grads  else round(grads[parent] + gp)

Contributions to one tensor are added pairwise in float32 (float64 in the reference mode) and
rounded to its gradient format, as the framework's gradient accumulation does in the tensor's
dtype. A leaf's first gradient is the array the pass computed when nothing else refers to
it (``backend.is_unshared``), else a copy, so no two gradients ever share memory. By
default the graph is freed as it is walked (``retain_graph=True`` keeps it).

>>> from fpsim.autograd import Tensor
>>> x = Tensor([1.0, 2.0, 3.0], "fp16", requires_grad=True)
>>> (x * x).sum().backward()
>>> x.grad.data
array([2., 4., 6.], dtype=float32)
"""
from __future__ import annotations

from .. import backend
from ..options import check_flag, described
from ..backend import xp
from ..exact import observers, underflow
from .context import current_policy, is_grad_enabled
from .numerics import container_of, resolve, round_array

__all__ = ["Tensor", "record", "as_tensor", "register"]


class _Registry(dict):
    def __missing__(self, name):
        raise RuntimeError(f"the op {name!r} is not registered: import fpsim.autograd (it "
                           f"imports every ops module) before using Tensor operators")


_OPS = _Registry()  # op name -> function, filled by register()


def register(*ops) -> None:
    """Make each function the implementation ``Tensor`` dispatches to under its ``__name__``."""
    for op in ops:
        _OPS[op.__name__] = op


class Tensor:
    """An array of values in one format, optionally tracked for gradients.

    ``Tensor(data, fmt=None, requires_grad=False)`` rounds ``data`` once into ``fmt`` (default:
    the current policy's ``input`` format). ``.grad`` is ``None`` or a ``Tensor`` in
    ``grad_fmt`` holding the gradients summed over every ``backward`` call since the last
    ``zero_grad``.
    """

    __slots__ = ("data", "fmt", "grad_fmt", "requires_grad", "grad", "name",
                 "_parents", "_backward", "_op", "_retain")
    __array_ufunc__ = None  # ndarray (op) Tensor defers to Tensor's reflected operators

    def __init__(self, data, fmt=None, requires_grad: bool = False, *, name: str | None = None):
        requires_grad = check_flag("requires_grad", requires_grad)     # bool('no') is True
        policy = current_policy()
        fmt = policy.input if fmt is None else resolve(fmt)
        if isinstance(data, Tensor):
            data = data.data
        try:
            array = xp.asarray(data)
        except ValueError:      # a ragged list: NumPy's "inhomogeneous shape after 1 dimensions"
            raise ValueError(f"Tensor data must be real numbers in a rectangular array (nested "
                             f"lists of equal lengths), got {described(data)}") from None
        if not (backend.isdtype(array.dtype, "numeric") or backend.isdtype(array.dtype, "bool")):
            raise TypeError(f"Tensor data must be real numbers, got dtype {array.dtype}")
        if array.dtype not in (xp.float32, xp.float64):
            array = backend.astype(array, xp.float64)
        rounded = round_array(array, fmt)
        if rounded is array or xp.shares_memory(rounded, array):
            rounded = backend.copy(rounded)
        self._init(backend.asarray(rounded, container_of(fmt)), fmt,
                   policy.grad or fmt, bool(requires_grad))
        self.name = name

    def _init(self, data, fmt, grad_fmt, requires_grad):
        self.data = data
        self.fmt = fmt
        self.grad_fmt = grad_fmt
        self.requires_grad = requires_grad
        self.grad = None
        self.name = None
        self._parents = ()
        self._backward = None
        self._op = None
        self._retain = False

    @classmethod
    def _wrap(cls, data, fmt, grad_fmt=None, requires_grad=False) -> "Tensor":
        """A tensor around ``data`` that is already in ``fmt`` (no rounding, no copy)."""
        out = cls.__new__(cls)
        out._init(data, fmt, grad_fmt if grad_fmt is not None else fmt, requires_grad)
        return out

    # --- properties -------------------------------------------------------------------------
    shape = property(lambda self: tuple(self.data.shape))   # a tuple on every backend
    ndim = property(lambda self: self.data.ndim)
    size = property(lambda self: backend.size(self.data))
    is_leaf = property(lambda self: self._op is None)

    def __len__(self) -> int:
        return len(self.data)

    def numpy(self):
        """The values as a host NumPy array (a copy)."""
        return backend.to_numpy(backend.copy(self.data))

    def item(self) -> float:
        if self.size != 1:
            raise ValueError(f"item() needs a tensor with one element, got shape {self.shape}")
        return float(xp.reshape(self.data, (-1,))[0])

    def __repr__(self) -> str:
        grad = ", requires_grad=True" if self.requires_grad else ""
        op = f", op={self._op}" if self._op else ""
        return f"Tensor({backend.array_text(self.data)}, fmt={self.fmt}{grad}{op})"

    # --- autograd ---------------------------------------------------------------------------
    def detach(self) -> "Tensor":
        """The same values (shared, not copied), outside every graph."""
        return Tensor._wrap(self.data, self.fmt, self.grad_fmt)

    def requires_grad_(self, flag: bool = True) -> "Tensor":
        if not self.is_leaf:
            raise ValueError("requires_grad_ can only change leaf tensors; use detach() first")
        self.requires_grad = bool(flag)
        return self

    def retain_grad(self) -> "Tensor":
        """Keep this non-leaf tensor's gradient in ``.grad`` during backward (to watch
        activation gradients underflow)."""
        self._retain = True
        return self

    def zero_grad(self) -> None:
        """Forget the accumulated gradient (``.grad`` becomes ``None``)."""
        self.grad = None

    def backward(self, grad=None, *, retain_graph: bool = False) -> None:
        """Accumulate d(self)/d(leaf) into ``.grad`` of every leaf that requires grad.

        ``grad`` (the seed) is required unless the tensor has exactly one element; it is
        rounded to ``self.grad_fmt``.
        """
        if not self.requires_grad:
            raise ValueError("backward() on a tensor that does not require grad: no leaf it "
                             "depends on has requires_grad=True (or it was made under no_grad)")
        if grad is None:
            if self.size != 1:
                raise ValueError(
                    f"backward() on a non-scalar tensor of shape {self.shape} needs a seed "
                    f"gradient of that shape, e.g. t.backward(numpy.ones({self.shape})); or "
                    f"reduce to a scalar first (t.sum())")
            seed = xp.ones(self.shape, container_of(self.grad_fmt))
        else:
            seed = grad.data if isinstance(grad, Tensor) else xp.asarray(grad)
            if seed.shape != self.shape:
                raise ValueError(f"seed gradient shape {seed.shape} does not match the tensor's "
                                 f"shape {self.shape}")
            if seed.dtype not in (xp.float32, xp.float64):
                seed = backend.astype(seed, xp.float64)
            seed = round_array(seed, self.grad_fmt)
        _run_backward(self, seed, retain_graph)

    # --- operators and methods: the registered ops (ops_*.py) ----------------------------
    def __add__(self, other): return _OPS["add"](self, other)
    def __radd__(self, other): return _OPS["add"](other, self)
    def __sub__(self, other): return _OPS["sub"](self, other)
    def __rsub__(self, other): return _OPS["sub"](other, self)
    def __mul__(self, other): return _OPS["mul"](self, other)
    def __rmul__(self, other): return _OPS["mul"](other, self)
    def __truediv__(self, other): return _OPS["div"](self, other)
    def __rtruediv__(self, other): return _OPS["div"](other, self)
    def __neg__(self): return _OPS["neg"](self)
    def __pow__(self, exponent): return _OPS["pow"](self, exponent)
    def __matmul__(self, other): return _OPS["matmul"](self, other)
    def __rmatmul__(self, other): return _OPS["matmul"](other, self)
    def __getitem__(self, index): return _OPS["getitem"](self, index)

    def exp(self): return _OPS["exp"](self)
    def log(self): return _OPS["log"](self)
    def sqrt(self): return _OPS["sqrt"](self)
    def tanh(self): return _OPS["tanh"](self)
    def sigmoid(self): return _OPS["sigmoid"](self)
    def relu(self): return _OPS["relu"](self)
    def gelu(self, approximate="none"): return _OPS["gelu"](self, approximate)
    def masked_fill(self, mask, value): return _OPS["masked_fill"](self, mask, value)
    def sum(self, axis=None, keepdims=False, *, accumulation=None):
        return _OPS["sum"](self, axis, keepdims, accumulation=accumulation)
    def mean(self, axis=None, keepdims=False, *, accumulation=None):
        return _OPS["mean"](self, axis, keepdims, accumulation=accumulation)
    def max(self, axis=None, keepdims=False): return _OPS["max"](self, axis, keepdims)
    def softmax(self, axis=-1): return _OPS["softmax"](self, axis)
    def log_softmax(self, axis=-1): return _OPS["log_softmax"](self, axis)
    def reshape(self, *shape): return _OPS["reshape"](self, *shape)
    def transpose(self, *axes): return _OPS["transpose"](self, *axes)
    def cast(self, fmt): return _OPS["cast"](self, fmt)

    @property
    def T(self): return _OPS["transpose"](self)


def as_tensor(value, fmt=None) -> Tensor:
    """``value`` itself when it is a Tensor, else a constant Tensor rounded into ``fmt``
    (default: the policy's ``input`` format)."""
    return value if isinstance(value, Tensor) else Tensor(value, fmt)


def record(data, fmt, parents, backward, op: str) -> Tensor:
    """The dispatch point of every op: wrap the output and, if needed, the graph edge."""
    grad_fmt = current_policy().grad or fmt
    out = Tensor._wrap(data, fmt, grad_fmt)
    if is_grad_enabled():
        for parent in parents:
            if parent.requires_grad:
                out.requires_grad = True
                out._parents = parents
                out._backward = backward
                out._op = op
                break
    return out


def _topological_order(root: Tensor) -> list:
    """Every node ``root`` depends on, each after all of its parents: reversed, each node
    comes after every node it sends a gradient to, so its gradient is complete when it is
    passed on. The order fpsim 0.1 used (``_first_push_order``) is kept wherever it is such an
    order, so those graphs keep their summation order and their bits; where it is not (a
    residual ``a + f(a)``: the push from ``+`` put ``a`` before ``f(a)``, and ``f``'s gradient
    reached ``a`` after ``a`` had been passed on, so fpsim 0.1 dropped it), a depth-first
    post-order that marks a node when it is expanded (``_post_order``)."""
    order = _first_push_order(root)
    return order if _parents_first(order) else _post_order(root)


def _first_push_order(root: Tensor) -> list:
    order, seen, stack = [], {id(root)}, [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        stack.append((node, True))
        for parent in node._parents:
            if parent.requires_grad and id(parent) not in seen:
                seen.add(id(parent))
                stack.append((parent, False))
    return order


def _parents_first(order: list) -> bool:
    """Whether every node of ``order`` comes after each of its parents in it."""
    position = {id(node): i for i, node in enumerate(order)}
    return all(position.get(id(parent), -1) < i for i, node in enumerate(order)
               for parent in node._parents)


def _post_order(root: Tensor) -> list:
    order, visited, stack = [], set(), [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        stack.append((node, True))
        for parent in node._parents:
            if parent.requires_grad and id(parent) not in visited:
                stack.append((parent, False))
    return order


def _add_grads(a, b, fmt):
    return round_array(a + b, fmt)


def _run_backward(root: Tensor, seed, retain_graph: bool) -> None:
    with observers.backward_pass():
        _backward_pass(root, seed, retain_graph, underflow.attribution())


def _backward_pass(root: Tensor, seed, retain_graph: bool, attribution) -> None:
    """``attribution``: the per-tensor underflow observer to charge (None: not counted)."""
    order = _topological_order(root)
    grads = {id(root): seed}
    in_flight: dict = {}           # per-tensor underflow counts of gradients on their way
    for node in reversed(order):
        g = grads.pop(id(node), None)
        if g is None:
            continue
        if node._backward is None:
            if node._op is not None:
                raise RuntimeError(
                    f"backward through the graph of '{node._op}' a second time: its saved "
                    f"values were freed; pass retain_graph=True to the first backward()")
            owned = backend.is_unshared(g)   # its own statement: an argument list holds g
            _accumulate_leaf(node, g, owned)
            continue
        if node._retain:
            _accumulate_leaf(node, g, False)
        # no local name for the gradients: a reference held here would make every one look
        # shared to backend.is_unshared and be copied
        _send(grads, node._parents, _counted_backward(node, g, in_flight, attribution)
              if attribution is not None else node._backward(g, node.grad_fmt))
        if not retain_graph:
            node._backward = None
            node._parents = ()


def _counted_backward(node: Tensor, g, in_flight: dict, attribution):
    """``node``'s backward, each rounding it makes charged to the input whose gradient it
    produced (``attribution.send``, a ``underflow.PerTensorUnderflow``: it collects the
    leaves')."""
    with attribution.op_roundings() as roundings:
        parent_grads = node._backward(g, node.grad_fmt)
    targets = [(id(parent), gp, parent._op is None and parent._backward is None)
               for parent, gp in zip(node._parents, parent_grads)
               if gp is not None and parent.requires_grad]
    attribution.send(roundings, in_flight.pop(id(node), underflow.UnderflowCount()), targets,
                     in_flight, len(node._parents) == 1)
    return parent_grads


def _send(grads: dict, parents, parent_grads) -> None:
    """Add each parent's gradient to ``grads`` (a function, so that no loop variable keeps
    a reference to a gradient array once it returns: see ``backend.is_unshared``)."""
    for parent, gp in zip(parents, parent_grads):
        if gp is None or not parent.requires_grad:
            continue
        key = id(parent)
        grads[key] = gp if key not in grads else _add_grads(grads[key], gp, parent.grad_fmt)


def _accumulate_leaf(node: Tensor, g, owned: bool) -> None:
    """``owned``: nothing else refers to ``g`` (``backend.is_unshared``), so it is kept, not
    copied."""
    if node.grad is None:
        node.grad = Tensor._wrap(g if owned else backend.copy(g), node.grad_fmt)
    else:
        node.grad.data = _add_grads(node.grad.data, g, node.grad_fmt)
