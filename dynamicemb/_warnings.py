"""Warnings given once per process.

Some things a user may not notice (a state dict without the dynamic tables'
rows, an option that has no effect, rows in host memory for want of a device
budget) are worth one warning, not one per table, module or step. Each such
warning has a key; ``warn_once`` warns the first time a key is seen and never
again in the process, whatever Python's warning filters would repeat.
"""

import threading
import warnings

_lock = threading.Lock()
_warned: set[str] = set()


def warn_once(key: str, message: str, category: type[Warning] = UserWarning, stacklevel: int = 2):
    """Warns ``message`` unless a warning with ``key`` was given before.

    Args:
        key (str): what the warning is about; one warning per key and process.
        message (str): the warning's text.
        category (type[Warning]): the warning class. Defaults to UserWarning.
        stacklevel (int): as for ``warnings.warn``, counted from the caller of
            ``warn_once``. Defaults to 2 (the caller's caller).

    Returns:
        bool: True when it warned now.
    """
    with _lock:
        if key in _warned:
            return False
        _warned.add(key)
    warnings.warn(message, category, stacklevel=stacklevel + 1)
    return True


def forget(key: str) -> None:
    """Lets the warning of ``key`` be given again (for tests)."""
    with _lock:
        _warned.discard(key)
