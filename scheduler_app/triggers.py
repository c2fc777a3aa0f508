"""Manual triggers: what an idempotency key is bound to, and many triggers of one task at once.

The rules of a batch are trigger()'s, applied to the whole batch: the same idempotency key returns
the same execution (also twice within one batch), a key used with other params is a Conflict, and a
refused batch writes nothing. On PostgreSQL a batch is one statement (``postgres.trigger``); every
other database, and the cases that statement leaves to it, take the ORM path: one transaction of the
task read, one look-up of the keyed occurrence ids, one multi-row INSERT of the executions and one
of their creation events, whatever the batch's size.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction

from scheduler_app import journal, occurrences
from scheduler_app.exceptions import Conflict, TaskNotFound
from scheduler_app.models import Execution, Status, Task, manual_occurrence_id
from scheduler_app.statements import journal_statements

KEY_REUSED = "This idempotency key was used with other params."


def _digest(params: dict[str, Any]) -> str:
    canonical = json.dumps(params, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


# Most triggers give no params: their digest, worked out once.
NO_PARAMS = _digest({})


def payload_hash(params: dict[str, Any] | None) -> str:
    """What an idempotency key is bound to: the trigger's own params, canonical."""
    return _digest(params) if params else NO_PARAMS


@dataclass(frozen=True)
class Trigger:
    """One trigger of a batch, validated."""

    idempotency_key: str | None
    params: dict[str, Any] | None


def create_many(
    task_id: str, source: str | None, triggers: list[Trigger], now: datetime
) -> list[tuple[Execution, bool]]:
    """The execution of each trigger, in order, and whether this call created it."""
    order = [manual_occurrence_id(task_id, trigger.idempotency_key, now) for trigger in triggers]
    planned: dict[uuid.UUID, Execution] = {}
    # The params each trigger gave, apart from those its execution gets merged over the task's.
    callers: dict[uuid.UUID, dict[str, Any]] = {}
    for occurrence_id, trigger in zip(order, triggers, strict=True):
        digest = payload_hash(trigger.params)
        twin = planned.get(occurrence_id)
        if twin is None:
            callers[occurrence_id] = trigger.params or {}
            planned[occurrence_id] = occurrences.manual(
                task_id,
                occurrence_id,
                source or "",
                trigger.idempotency_key,
                digest,
                trigger.params or {},
                now,
                now,
            )
        elif twin.payload_hash != digest:
            raise Conflict(KEY_REUSED)
    keyed = [occurrence_id for occurrence_id, e in planned.items() if e.idempotency_key is not None]
    reason = f"triggered by {source}" if source else "triggered"
    one_statement = journal_statements().insert_manual_many(
        task_id, source or "", list(planned.values()), keyed, reason, now
    )
    if one_statement is not None:
        inserted, left_out = one_statement
        existing = existing_executions(left_out) if left_out else {}
        return _answers(order, {e.occurrence_id: e for e in inserted}, existing)
    try:
        with transaction.atomic():
            return _create(task_id, planned, callers, keyed, reason, order, now)
    except IntegrityError:
        # A concurrent trigger took one of the keys between the look-up and the insert: the
        # look-up of a second try finds it.
        with transaction.atomic():
            return _create(task_id, planned, callers, keyed, reason, order, now)


def _create(
    task_id: str,
    planned: dict[uuid.UUID, Execution],
    callers: dict[uuid.UUID, dict[str, Any]],
    keyed: list[uuid.UUID],
    reason: str,
    order: list[uuid.UUID],
    now: datetime,
) -> list[tuple[Execution, bool]]:
    found = Task.objects.filter(id=task_id).values_list("revision", "params", "retry_max_attempts").first()
    if found is None:
        raise TaskNotFound()
    revision, task_params, max_attempts = found
    existing = existing_executions(keyed) if keyed else {}
    for occurrence_id, execution in existing.items():
        if execution.payload_hash != planned[occurrence_id].payload_hash:
            raise Conflict(KEY_REUSED)
    new = [e for occurrence_id, e in planned.items() if occurrence_id not in existing]
    for execution in new:
        # A second try after a lost race starts from the same objects: nothing of the first stays.
        execution.sequence = None
        execution.task_revision, execution.max_attempts = revision, max_attempts
        execution.params = {**task_params, **callers[execution.occurrence_id]}
    Execution.objects.bulk_create(new)
    if new and new[0].sequence is None:
        # A backend that cannot return the keys of a multi-row INSERT (MySQL).
        sequences = dict(
            Execution.objects.filter(occurrence_id__in=[e.occurrence_id for e in new]).values_list(
                "occurrence_id", "sequence"
            )
        )
        for execution in new:
            execution.sequence = sequences[execution.occurrence_id]
    journal.append(journal.event(execution.sequence, now, "", Status.PENDING, reason) for execution in new)
    return _answers(order, {e.occurrence_id: e for e in new}, existing)


def _answers(
    order: list[uuid.UUID], new: dict[uuid.UUID, Execution], existing: dict[uuid.UUID, Execution]
) -> list[tuple[Execution, bool]]:
    """Each trigger's execution and whether this call created it (a key's first trigger only)."""
    answers: list[tuple[Execution, bool]] = []
    seen: set[uuid.UUID] = set()
    for occurrence_id in order:
        created = occurrence_id in new and occurrence_id not in seen
        seen.add(occurrence_id)
        answers.append((new.get(occurrence_id) or existing[occurrence_id], created))
    return answers


def existing_executions(occurrence_ids: list[uuid.UUID]) -> dict[uuid.UUID, Execution]:
    """The executions some of these occurrence ids already have."""
    return {e.occurrence_id: e for e in Execution.objects.filter(occurrence_id__in=occurrence_ids)}
