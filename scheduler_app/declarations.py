"""Tasks declared beside their function: ``@job("nightly-report", cron="0 2 * * *", ...)``.

A declaration is the whole definition of the task whose id is the job's name
and whose handler runs that function, ``{"kind": "python", "function": name}``
(plus ``timeout`` when given). Declarations are kept here as written and
validated when they are used (system check E040, ``refresh_tasks()`` at runner
start), so that an invalid one is reported with its field errors instead of
breaking the import of its module.
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from typing import Any

from scheduler_app import definitions
from scheduler_app.exceptions import InvalidDefinition


class Declaration:
    """One ``@job`` declaration: the definition it makes and where its function lives."""

    def __init__(self, definition: dict[str, Any], path: str) -> None:
        self.definition = definition
        self.path = path

    @property
    def task_id(self) -> str:
        return str(self.definition["id"])


_declared: dict[str, Declaration] = {}
_lock = threading.Lock()


def definition_of(name: str, cron: str | None, timeout: Any, fields: dict[str, Any]) -> dict[str, Any]:
    """The definition ``@job(name, cron=..., timeout=..., **fields)`` declares."""
    handler: dict[str, Any] = {"kind": "python", "function": name}
    if timeout is not None:
        handler["timeout"] = timeout
    definition: dict[str, Any] = {"id": name, **fields, "handler": handler}
    if cron is not None:
        definition["cron"] = cron
    return definition


def declare(name: str, definition: dict[str, Any], path: str) -> None:
    """Record a declaration; the first one under a name is kept (a second function is check E038)."""
    with _lock:
        _declared.setdefault(name, Declaration(definition, path))


def forget(name: str) -> None:
    with _lock:
        _declared.pop(name, None)


def declared() -> list[Declaration]:
    """Every declaration, by id."""
    with _lock:
        return [_declared[name] for name in sorted(_declared)]


def where(task_id: str) -> str:
    """Where the declaration of ``task_id`` lives in this process, as messages name it."""
    with _lock:
        declaration = _declared.get(task_id)
    return f"@job in {declaration.path}" if declaration else "@job"


def validate(settings_ids: Collection[str] = ()) -> list[dict[str, Any]]:
    """The declared definitions; InvalidDefinition with errors keyed ``@job('name').field`` otherwise.

    ``settings_ids`` are the ids SCHEDULER_APP["TASKS"] declares: one task has one declaration.
    """
    errors: dict[str, list[str]] = {}
    valid = []
    for declaration in declared():
        prefix = f"@job({declaration.task_id!r})"
        try:
            definitions.validate_definition(declaration.definition)
        except InvalidDefinition as exc:
            for field, messages in exc.errors.items():
                errors.setdefault(f"{prefix}.{field}" if field else prefix, []).extend(messages)
            continue
        if declaration.task_id in settings_ids:
            errors.setdefault(f"{prefix}.id", []).append(
                f"Also declared in SCHEDULER_APP['TASKS']; declare task {declaration.task_id!r} in one place."
            )
        valid.append(declaration.definition)
    if errors:
        raise InvalidDefinition("@job declarations are invalid.", errors=errors)
    return valid
