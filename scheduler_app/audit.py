"""The audit trail of definitions: who changed which task, when, and each field from what to what.

Every write of a task in scheduler_app.services (and a runner's ``delete_after_run``) records one
TaskChange in the same transaction. Who acts is set around the call: the admin and the API set
their user, ``scheduler.acting_as(name)`` sets it for a script, a sync from code records itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from django.utils import timezone

from scheduler_app import definitions
from scheduler_app.handlers import registry
from scheduler_app.models import ChangeAction, ChangeVia, Task, TaskChange

# Every field of a definition, the one the scheduler sets on a declared task, and why and until when
# a task is paused (who and since when are the change's own ``by`` and ``at``).
TRACKED = (*definitions.MODEL_FIELDS, "declared_in", "disabled_reason", "disabled_until")
# A change of these fields only is an enable or a disable (a removed declaration disables its task).
SWITCH_FIELDS = frozenset({"enabled", "disabled_reason", "disabled_until", "declared_in"})

_actor: ContextVar[tuple[str, str]] = ContextVar("scheduler_app_actor", default=(ChangeVia.PYTHON, ""))


@contextmanager
def acting(by: str, via: str = ChangeVia.PYTHON) -> Iterator[None]:
    """Record the task changes made inside the block as made by ``by`` through ``via``."""
    token = _actor.set((via, str(by)[:150]))
    try:
        yield
    finally:
        _actor.reset(token)


def actor() -> str:
    """Who acts now, as the next change will record it (empty from code)."""
    return _actor.get()[1]


def values(task: Task) -> dict[str, Any]:
    """The tracked fields of a task as they are now, secrets included: compared, never stored."""
    return {field: getattr(task, field) for field in TRACKED}


def record(
    action: str,
    task: Task,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    *,
    via: str | None = None,
) -> TaskChange | None:
    """Write what changed between two ``values()`` of one task (None: it did not exist); nothing
    when no tracked field changed. Call it inside the transaction of the change. ``via`` names
    the path where it is always the same (a sync from code); who acts is set by ``acting()``."""
    changed = [field for field in TRACKED if before is None or after is None or before[field] != after[field]]
    if not changed:
        return None
    switch = action in (ChangeAction.UPDATE, ChangeAction.REPLACE)
    if switch and set(changed) <= SWITCH_FIELDS and "enabled" in changed:
        action = ChangeAction.ENABLE if after and after["enabled"] else ChangeAction.DISABLE
    acting_via, by = _actor.get()
    return TaskChange.objects.create(
        task_id=task.id,
        at=timezone.now(),
        action=action,
        via=via or acting_via,
        by=by,
        revision=task.revision,
        changes={field: [_shown(field, before), _shown(field, after)] for field in changed},
    )


def _shown(field: str, state: dict[str, Any] | None) -> Any:
    if state is None:
        return None
    value = state[field]
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return registry.masked(value) if field == "handler" else value
