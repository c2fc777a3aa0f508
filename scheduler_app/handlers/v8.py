"""Whether V8 is installed, asked without loading the js handler: the checks need only that."""

from __future__ import annotations

import importlib.util


def v8_available() -> bool:
    """Whether mini-racer (the ``js`` extra) is installed for this Python; V8 itself is not loaded."""
    try:
        return importlib.util.find_spec("py_mini_racer") is not None
    except (ImportError, ValueError):
        return False
