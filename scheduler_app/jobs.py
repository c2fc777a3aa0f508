"""The project's Python functions that tasks run by name: ``@job("name")`` and the FUNCTIONS setting.

A task runs one with the handler ``{"kind": "python", "function": "name"}``.
Only a registered name can be chosen, so whoever edits a task in the admin or
the API picks among the functions the project offers and cannot run any other
importable callable.

``@job("name", cron="0 2 * * *", ...)`` also declares the task that runs the
function, kept in scheduler_app.declarations and synced like TASKS.

Functions are found as the admin finds ``admin.py``: each installed app's
``jobs`` module is imported when Django starts (``autodiscover``); FUNCTIONS
(name -> dotted path) covers functions that live elsewhere.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from django.utils.module_loading import autodiscover_modules, import_string

from scheduler_app import declarations
from scheduler_app.conf import scheduler_settings

F = TypeVar("F", bound=Callable[..., Any])

_decorated: dict[str, Callable[..., Any]] = {}
# Names that two different functions were registered under: name -> their dotted paths.
_clashes: dict[str, set[str]] = {}
_lock = threading.Lock()


def job(name: str, /, *, cron: str | None = None, timeout: Any = None, **fields: Any) -> Callable[[F], F]:
    """Register the decorated function under ``name`` for the ``python`` handler kind.

    With ``cron`` (and any other definition field) it also declares the task
    ``name`` that runs it: handler ``{"kind": "python", "function": name}``,
    with ``timeout`` when given. ``name`` is positional, so that ``name=`` is the task's name.
    """
    if not isinstance(name, str) or not name.strip():
        raise TypeError("job() takes the function's name, a non-empty string: @job('send-invoices').")
    for reserved in ("id", "handler"):
        if reserved in fields:
            raise TypeError(f"@job({name!r}) sets the task's {reserved} itself: leave {reserved}= out.")
    declares = cron is not None or timeout is not None or bool(fields)

    def register(function: F) -> F:
        if not callable(function):
            raise TypeError(f"@job({name!r}) decorates a function.")
        with _lock:
            known = _decorated.get(name)
            if known is not None and path_of(known) != path_of(function):
                _clashes.setdefault(name, {path_of(known)}).add(path_of(function))
            _decorated.setdefault(name, function)
        if declares:
            declarations.declare(
                name, declarations.definition_of(name, cron, timeout, fields), path_of(function)
            )
        return function

    return register


def autodiscover() -> None:
    """Import every installed app's ``jobs`` module, so that their ``@job`` functions register."""
    autodiscover_modules("jobs")


def path_of(function: Callable[..., Any]) -> str:
    return f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', repr(function))}"


def configured() -> dict[str, Any]:
    """FUNCTIONS as set: name -> dotted path (or callable); {} when it is not a dict (check E036)."""
    value = scheduler_settings.FUNCTIONS
    return value if isinstance(value, dict) else {}


def names() -> list[str]:
    """Every registered name, sorted."""
    with _lock:
        decorated = set(_decorated)
    return sorted(decorated | {str(name) for name in configured()})


def get(name: str) -> Callable[..., Any] | None:
    """The function registered under ``name``; None when there is none or its path cannot be imported."""
    with _lock:
        function = _decorated.get(name)
    if function is not None:
        return function
    target = configured().get(name)
    if target is None:
        return None
    if callable(target):
        return target  # type: ignore[no-any-return]
    try:
        imported = import_string(str(target))
    except ImportError:
        return None  # check E037 names the path and its error
    return imported if callable(imported) else None


def clashes() -> dict[str, list[str]]:
    """Names that more than one function claims (check E038): name -> the functions' paths."""
    with _lock:
        found = {name: set(paths) for name, paths in _clashes.items()}
        decorated = dict(_decorated)
    for name, target in configured().items():
        if str(name) in decorated:
            other = target if isinstance(target, str) else path_of(target)
            if other != path_of(decorated[str(name)]):
                found.setdefault(str(name), {path_of(decorated[str(name)])}).add(other)
    return {name: sorted(paths) for name, paths in sorted(found.items())}


def forget(name: str) -> None:
    """Unregister a decorated name and the task it declares (tests)."""
    with _lock:
        _decorated.pop(name, None)
        _clashes.pop(name, None)
    declarations.forget(name)
