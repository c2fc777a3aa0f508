"""Occurrences built without ``Model.__init__``: one for a fire time of a task or for a manual
trigger; and scheduled ones inserted many at once.

The runner's scheduling of due minutes and a backfill both write scheduled ones; the unique
occurrence id (``scheduled_occurrence_id``) makes a second insert of one fire time a no-op,
whoever writes it.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from functools import cache
from typing import Any

from scheduler_app import schedule
from scheduler_app.models import Execution, Status, Task, TriggerType, built, scheduled_occurrence_id
from scheduler_app.statements import journal_statements


def scheduled(
    task: Task,
    scheduled_for: datetime,
    now: datetime,
    status: str,
    missed: dict[str, Any] | None = None,
    *,
    occurrence_id: uuid.UUID | None = None,
    source: str = "cron",
) -> Execution:
    """An unsaved occurrence of ``task`` for its fire time ``scheduled_for``, due at that time
    plus its jitter; ``missed`` is the record of the fire times it stands for besides its own."""
    occurrence_id = occurrence_id or scheduled_occurrence_id(task.id, scheduled_for)
    # Without Model.__init__ (models.built): a burst of 10,000 due tasks builds 10,000 of these.
    return built(
        Execution,
        {
            **_defaults(),
            "occurrence_id": occurrence_id,
            "task_id": task.id,
            "task_revision": task.revision,
            "trigger_type": TriggerType.SCHEDULED,
            "trigger_source": source,
            "scheduled_for": scheduled_for,
            "due_at": scheduled_for + schedule.jitter(task.jitter_seconds, occurrence_id),
            "missed_fire_times": missed,
            "params": dict(task.params),
            "status": status,
            "max_attempts": task.retry_max_attempts,
            "created_at": now,
            "updated_at": now,
            "finished_at": now if status == Status.INTERRUPTED else None,
        },
    )


def manual(
    task_id: str,
    occurrence_id: uuid.UUID,
    source: str,
    idempotency_key: str | None,
    payload_hash: str,
    params: dict[str, Any],
    due_at: datetime,
    now: datetime,
) -> Execution:
    """An unsaved manual occurrence of ``task_id``: what ``Execution(...)`` of these fields builds,
    for the producer of a stream of triggers, where ``__init__`` was a fifth of a trigger's Python."""
    return built(
        Execution,
        {
            **_defaults(),
            "occurrence_id": occurrence_id,
            "task_id": task_id,
            "trigger_type": TriggerType.MANUAL,
            "trigger_source": source,
            "idempotency_key": idempotency_key,
            "payload_hash": payload_hash,
            "params": params,
            "due_at": due_at,
            "created_at": now,
            "updated_at": now,
        },
    )


@cache
def _defaults() -> dict[str, Any]:
    """The attribute values of a new Execution() for every field whose default is not a callable
    (the one callable default, params, a new dict, is always given)."""
    new = Execution()
    return {
        f.attname: getattr(new, f.attname)
        for f in Execution._meta.concrete_fields
        if not (f.has_default() and callable(f.default))
    }


def insert(rows: Sequence[tuple[Execution, str]], node: str, now: datetime) -> list[Execution]:
    """Insert new occurrences, each with its creation event (the reason given with it); those whose
    occurrence id exists already are left out. The inserted ones, with their sequence."""
    if not rows:
        return []
    return journal_statements().insert_scheduled(rows, node, now)
