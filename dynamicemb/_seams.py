"""Code of a package above that a package below calls, found when first needed.

A package imports only the packages below it (tools/check_layers.py). Where a
lower package must call up (a sharded collection's ``state_dict()`` writes
its dynamic tables' rows the way ``dynamicemb.checkpoint`` writes them; the
metrics' meter carries the package's version), the package's ``__init__.py``,
above every other, names the code here, and the lower package asks for it by
name::

    provide("model_state_rows", loader)     # dynamicemb/__init__.py
    provided("model_state_rows")            # dynamicemb/shard: loader(), or None

A loader imports what it names on the first request. One that cannot (a
Bazel target that depends on the package below alone) gives None, and the
caller says what is missing.

A package's names imported on first use (its ``__getattr__``) are kept the
same way: ``first_use`` reads the name once and keeps it in the package.
"""

from collections.abc import Callable
from typing import Any

_loaders: dict[str, Callable[[], Any]] = {}
_loaded: dict[str, Any] = {}


def provide(name: str, loader: Callable[[], Any]) -> None:
    """Names ``loader`` as what ``provided(name)`` returns the result of."""
    _loaders[name] = loader
    _loaded.pop(name, None)


def provided(name: str) -> Any:
    """What ``name``'s loader returns (loaded once), or None where nothing
    provides it or its package cannot be imported."""
    if name not in _loaded:
        loader = _loaders.get(name)
        try:
            _loaded[name] = None if loader is None else loader()
        except ImportError:
            return None
    return _loaded[name]


def first_use(namespace: dict[str, Any], name: str, module: Any) -> Any:
    """``module``'s ``name`` for a package's ``__getattr__``, kept in the
    package's ``namespace`` (its ``globals()``) so that later reads find it
    there."""
    value = getattr(module, name)
    namespace[name] = value
    return value
