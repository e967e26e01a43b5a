"""The one grammar of option strings: ``head`` or ``head:key=value,key=value,...``.

Precision recipes (``fp8-delayed:history=16``), accumulation models, loss scalers
(``dynamic:init_scale=1024``) and learning-rate schedules (``cosine:t_max=100``) are all
written this way and split here, by one function, into the head and its options; each kind
then builds its own typed object from them and checks the values itself. A jmp policy
(``params=fp32,compute=fp16,output=fp32``) is the options without a head. Accumulation models
(``blocked:4:fp32``) keep their colon-separated fields: they are written as values inside the
other strings (``accumulation=blocked:4:fp32``, ``acc=...``), where a comma would end them.

>>> split_options("fp8-delayed:history=16,margin=1", "FP8 recipe")
('fp8-delayed', {'history': '16', 'margin': '1'})
>>> split_options("dynamic", "scaler")
('dynamic', {})
>>> split_options("static:1024", "scaler", positional="scale")
('static', {'scale': '1024'})
>>> split_options("cosine:t_max", "schedule")
Traceback (most recent call last):
ValueError: schedule 'cosine:t_max': 't_max' needs a value (t_max=...)
"""
from __future__ import annotations

__all__ = ["split_options", "number"]


def split_options(text: str, what: str, *, positional: str | None = None,
                  headless: bool = False) -> tuple[str, dict]:
    """``(head, {key: value text})`` of ``text``; the head lower-cased, keys lower-cased with
    ``-`` read as ``_``. ``positional``: the key a lone value names (``static:1024`` is
    ``static:scale=1024``); ``headless``: ``text`` is the options alone (a jmp policy,
    ``params=fp32,compute=fp16,...``; the head is ""). A key given twice, an empty part or a
    key without a value is a ``ValueError`` naming ``what`` and the text."""
    if not isinstance(text, str):
        raise TypeError(f"a {what} is a string like 'name' or 'name:key=value,...', got "
                        f"{type(text).__name__} {text!r}")
    head, colon, rest = ("", ":", text) if headless else text.strip().partition(":")
    head = head.strip().lower()
    if not head and not headless:
        raise ValueError(f"{what} {text!r}: it starts with a name (name:key=value,...)")
    options: dict[str, str] = {}
    if not rest.strip():
        if colon:
            raise ValueError(f"{what} {text!r}: nothing after ':' (give key=value,... or drop "
                             f"the ':')")
        return head, options
    parts = [part.strip() for part in rest.split(",")]
    for part in parts:
        key, sep, value = part.partition("=")
        key = key.strip().lower().replace("-", "_")
        if not sep and positional is not None and len(parts) == 1 and key:
            key, value = positional, part
        elif not key:
            raise ValueError(f"{what} {text!r}: {part!r} is not key=value")
        elif not sep or not value.strip():
            raise ValueError(f"{what} {text!r}: {key!r} needs a value ({key}=...)")
        if key in options:
            raise ValueError(f"{what} {text!r}: sets {key!r} twice")
        options[key] = value.strip()
    return head, options


def number(what: str, key: str, text: str, *, integer: bool = False):
    """An option's value read as a number (an int where ``integer``), or a ``ValueError``
    naming the option."""
    try:
        return int(text) if integer else float(text)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise ValueError(f"{what}: {key} must be {kind}, got {text!r}") from None
