"""The one way MiniPIC changes vLLM: wrap a class or module attribute that vLLM looks up at call time."""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable
from typing import Any


def wrap_attribute(
    owner: type | types.ModuleType, name: str, wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]
) -> None:
    """Replace ``owner.name`` by ``wrapper(original)``, once per process.

    vLLM calls plugin ``register()`` several times per process, so repeat calls are
    no-ops. Methods reached through the class (``staticmethod``/``classmethod``
    bound to it) are wrapped as the plain callables vLLM sees and stored back as
    static methods; instance methods stay instance methods.
    """
    marker = f"_minipic_wrapped_{name}"
    if owner.__dict__.get(marker):
        return
    original = getattr(owner, name)
    wrapped = functools.wraps(original)(wrapper(original))
    if isinstance(inspect.getattr_static(owner, name), (staticmethod, classmethod)):
        wrapped = staticmethod(wrapped)
    setattr(owner, name, wrapped)
    setattr(owner, marker, True)
