"""Imports that a library makes at its own import but that this program never needs, put off until used.

transformers' ``modeling_utils`` imports its object-detection losses, which import
``scipy.optimize.linear_sum_assignment``: about a second and 400 modules of SciPy, in every process that
loads a model, for a function a masked LM never calls. While the model classes are imported, such a
module is stood in for by one whose named functions import the real module when first called; the
stand-in leaves ``sys.modules`` as soon as the import is done, so any later ``import`` gets the real one.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

# Module -> the functions imported from it at import time that only run when called.
TRANSFORMERS_UNUSED: Mapping[str, Sequence[str]] = {"scipy.optimize": ("linear_sum_assignment",)}


@contextmanager
def deferred(modules: Mapping[str, Sequence[str]] = TRANSFORMERS_UNUSED) -> Iterator[None]:
    """Within the block, ``from MODULE import NAME`` gives a function that imports MODULE when called.

    A module already imported is left as it is; any other name of a stood-in module imports the real
    module at once (so a library that wants more than the named functions gets what it asked for).
    """
    stood_in = [name for name in modules if name not in sys.modules]
    for name in stood_in:
        sys.modules[name] = _stand_in(name, modules[name])
    try:
        yield
    finally:
        for name in stood_in:
            if isinstance(sys.modules.get(name), _StandIn):
                del sys.modules[name]


class _StandIn(types.ModuleType):
    def __init__(self, name: str, functions: Sequence[str]) -> None:
        super().__init__(name)
        self._functions = frozenset(functions)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            # The import system asks for __path__ and the like: a plain module has none to give.
            raise AttributeError(attr)
        if attr not in self._functions:
            return getattr(_real(self.__name__), attr)
        return _on_call(self.__name__, attr)


def _stand_in(name: str, functions: Sequence[str]) -> _StandIn:
    return _StandIn(name, functions)


def _real(name: str) -> types.ModuleType:
    if isinstance(sys.modules.get(name), _StandIn):
        del sys.modules[name]
    return importlib.import_module(name)


def _on_call(module: str, function: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(_real(module), function)(*args, **kwargs)

    call.__name__ = call.__qualname__ = function
    return call
