"""Models and data sets by name, for ``fpsim train`` and sweeps: the built-in ones, and a
user's own through an importable factory.

``--model`` is ``mlp``, ``cnn``, ``transformer`` or ``MODULE:FACTORY``; ``--data`` is a
built-in data set (``DATASETS``: the 2-D ``blobs``, ``spirals``, ``teacher``; ``images``;
``tokens``) or ``MODULE:FACTORY``. ``--model-arg KEY=VALUE`` and ``--data-arg KEY=VALUE``
(repeatable) pass keyword arguments; a value is read as JSON where it is JSON (``8``,
``0.5``, ``true``, ``[8, 16]``, ``"x"``), else taken as the text given (``relu``). A factory
whose signature has a ``seed`` parameter is given ``--seed`` unless an argument names it.
``MODULE`` is imported from the current folder first, as ``python -m`` does, then from the
Python path. ``--loss MODULE:FUNCTION`` names a loss function the same way (not called: it is
the loss).

A factory returns an ``fpsim.nn.Module`` (models) or an ``fpsim.train.Dataset`` (data). Every
way it can fail (the module not importable, no such name, not callable, raising, returning
something else) is a ``ValueError`` of one line naming the option and the factory, raised
before anything is written.

>>> parse_arguments(["width=8", "act=relu", "sizes=[4, 2]"], "--model-arg")
{'width': 8, 'act': 'relu', 'sizes': [4, 2]}
"""
from __future__ import annotations

import importlib
import inspect
import json
import os
import sys

from .. import nn
from .data import DATASETS, Dataset, make_dataset

__all__ = ["MODELS", "parse_arguments", "load_factory", "build_model", "build_data",
           "is_factory"]

MODELS = ("mlp", "cnn", "transformer")


def is_factory(spec: str) -> bool:
    """Whether ``spec`` names a factory (``MODULE:FACTORY``) rather than a built-in."""
    return isinstance(spec, str) and ":" in spec


def parse_arguments(pairs, option: str) -> dict:
    """``["key=value", ...]`` as keyword arguments (values read as JSON where they are)."""
    arguments = {}
    for pair in pairs or ():
        key, sep, text = str(pair).partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise ValueError(f"{option} {pair!r}: give KEY=VALUE with KEY a Python name, e.g. "
                             f"{option} width=64")
        if key in arguments:
            raise ValueError(f"{option}: {key!r} is given twice")
        try:
            arguments[key] = json.loads(text)
        except ValueError:
            arguments[key] = text
    return arguments


def load_factory(spec: str, option: str):
    """The callable ``MODULE:NAME`` (NAME may be dotted, ``Class.build``) names."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{option} {spec!r}: a factory is MODULE:NAME, e.g. "
                         f"{option} mypackage.models:small_cnn")
    _current_folder_importable()
    try:
        found = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        raise ValueError(f"{option} {spec}: cannot import module {module_name!r} "
                         f"(ModuleNotFoundError: {_first_line(err)}); it is looked for in the "
                         f"current folder "
                         f"({os.getcwd()}) and on the Python path") from None
    except Exception as err:          # the user's module: any error importing it
        raise ValueError(f"{option} {spec}: cannot import module {module_name!r} "
                         f"({type(err).__name__}: {_first_line(err)})") from None
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise ValueError(f"{option} {spec}: module {module_name!r} has no {attribute!r}")
        found = getattr(found, part)
    if not callable(found):
        raise ValueError(f"{option} {spec}: {attribute!r} is a {type(found).__name__}, not a "
                         f"callable that builds one")
    return found


def _current_folder_importable() -> None:
    """Put the current folder first on the import path, as ``python -m`` does, so that
    ``--model mylm:tiny_lm`` finds ``mylm.py`` beside the user (once per process)."""
    here = os.getcwd()
    if not any(entry in ("", ".", here) for entry in sys.path):
        sys.path.insert(0, here)


def _call(factory, spec: str, option: str, arguments: dict, seed: int, wanted: type,
          wanted_name: str):
    arguments = dict(arguments)
    try:
        takes_seed = "seed" in inspect.signature(factory).parameters
    except (TypeError, ValueError):   # builtins without a signature
        takes_seed = False
    if takes_seed and "seed" not in arguments:
        arguments["seed"] = seed
    try:
        made = factory(**arguments)
    except Exception as err:          # the user's code: whatever it raises, one line
        raise ValueError(f"{option} {spec} raised {type(err).__name__}: "
                         f"{_first_line(err)}") from None
    if not isinstance(made, wanted):
        raise ValueError(f"{option} {spec} returned {type(made).__name__}, not {wanted_name}")
    return made


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def build_data(spec: str, arguments: dict, *, samples: int, features: int, classes: int,
               seed: int) -> Dataset:
    """The data set ``--data`` names, with ``--data-arg`` arguments."""
    if is_factory(spec):
        return _call(load_factory(spec, "--data"), spec, "--data", arguments, seed, Dataset,
                     "an fpsim.train.Dataset")
    if spec not in DATASETS:
        raise ValueError(f"unknown data set {spec!r}; built-in: {', '.join(DATASETS)}, or "
                         f"MODULE:FACTORY for your own")
    return make_dataset(spec, samples, features, classes, seed, **arguments)


def build_model(spec: str, arguments: dict, data: Dataset, *, hidden, activation: str,
                seed: int) -> nn.Module:
    """The model ``--model`` names for ``data``, with ``--model-arg`` arguments; the built-in
    ones are sized from the data (input shape, classes)."""
    if is_factory(spec):
        return _call(load_factory(spec, "--model"), spec, "--model", arguments, seed,
                     nn.Module, "an fpsim.nn.Module")
    if spec not in MODELS:
        raise ValueError(f"unknown model {spec!r}; built-in: {', '.join(MODELS)}, or "
                         f"MODULE:FACTORY for your own")
    outputs = data.classes if data.task == "classification" else data.y.shape[-1]
    builder = {"mlp": _mlp, "cnn": _cnn, "transformer": _transformer}[spec]
    try:
        return builder(data, outputs, hidden, activation, seed, **arguments)
    except TypeError as err:          # an argument the built-in does not take
        raise ValueError(f"--model {spec}: {_first_line(err)}") from None


def _mlp(data, outputs, hidden, activation, seed):
    if data.x.ndim != 2 or data.x.dtype.kind != "f":
        raise ValueError(f"--model mlp takes feature rows (samples, features); {data.name} "
                         f"has inputs {data.x.shape} of {data.x.dtype} (try --model cnn for "
                         f"images, transformer for tokens)")
    return nn.MLP([data.features, *hidden, outputs], activation=activation, rng=seed)


def _cnn(data, outputs, hidden, activation, seed, channels=(8, 16), kernel=3):
    """Per entry of ``channels``: Conv2d (padding keeps the size), the activation, 2x2 max
    pooling; then Flatten and a Linear read-out."""
    if data.x.ndim != 4 or data.x.dtype.kind != "f":
        raise ValueError(f"--model cnn takes images (samples, channels, height, width); "
                         f"{data.name} has inputs {data.x.shape}")
    if activation not in nn.ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose "
                         f"{', '.join(nn.ACTIVATIONS)}")
    _, depth, height, width = data.x.shape
    layers = []
    for i, out in enumerate(channels):
        layers += [nn.Conv2d(depth, out, kernel, padding=kernel // 2, rng=seed + i),
                   nn.ACTIVATIONS[activation](), nn.MaxPool2d(2)]
        depth, height, width = out, height // 2, width // 2
    if height < 1 or width < 1:
        raise ValueError(f"--model cnn: {len(channels)} poolings halve {data.x.shape[2:]} "
                         f"below one pixel; give fewer channels entries")
    return nn.Sequential(*layers, nn.Flatten(),
                         nn.Linear(depth * height * width, outputs, rng=seed + len(channels)))


def _transformer(data, outputs, hidden, activation, seed, **arguments):
    from .models import TokenTransformer
    if data.x.ndim != 2 or data.x.dtype.kind not in "iu" or data.task != "classification":
        raise ValueError(f"--model transformer takes token ids (samples, length) with one "
                         f"label per token; {data.name} has inputs {data.x.shape} of "
                         f"{data.x.dtype}")
    vocab = max(int(data.x.max()) + 1, outputs)
    return TokenTransformer(vocab, outputs, data.x.shape[1], seed=seed, **arguments)
