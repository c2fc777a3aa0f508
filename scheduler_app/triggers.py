"""Manual triggers: what an idempotency key is bound to, and many triggers of one task at once.

A batch is one transaction of a fixed number of round trips. The rules are trigger()'s, applied
to the whole batch: the same idempotency key returns the same
execution (also twice within one batch), a key used with other params is a Conflict, and a
refused batch writes nothing. A batch costs the task read, one look-up of its keyed occurrence
ids, one multi-row INSERT of executions and one of their creation events, whatever its size.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction

from scheduler_app import journal
from scheduler_app.exceptions import Conflict, TaskNotFound
from scheduler_app.models import Execution, Status, Task, TriggerType, manual_occurrence_id

KEY_REUSED = "This idempotency key was used with other params."


def payload_hash(params: dict[str, Any] | None) -> str:
    """What an idempotency key is bound to: the trigger's own params, canonical."""
    canonical = json.dumps(params or {}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class Trigger:
    """One trigger of a batch, validated."""

    idempotency_key: str | None
    params: dict[str, Any] | None


def create_many(
    task_id: str, source: str | None, triggers: list[Trigger], now: datetime
) -> list[tuple[Execution, bool]]:
    """The execution of each trigger, in order, and whether this call created it."""
    try:
        with transaction.atomic():
            return _create(task_id, source, triggers, now)
    except IntegrityError:
        # A concurrent trigger took one of the keys between the look-up and the insert: the
        # look-up of a second try finds it.
        with transaction.atomic():
            return _create(task_id, source, triggers, now)


def _create(
    task_id: str, source: str | None, triggers: list[Trigger], now: datetime
) -> list[tuple[Execution, bool]]:
    found = Task.objects.filter(id=task_id).values_list("revision", "params", "retry_max_attempts").first()
    if found is None:
        raise TaskNotFound()
    revision, task_params, max_attempts = found
    planned: dict[uuid.UUID, Execution] = {}
    order: list[uuid.UUID] = []
    for trigger in triggers:
        occurrence_id = manual_occurrence_id(task_id, trigger.idempotency_key)
        digest = payload_hash(trigger.params)
        twin = planned.get(occurrence_id)
        if twin is not None and twin.payload_hash != digest:
            raise Conflict(KEY_REUSED)
        if twin is None:
            planned[occurrence_id] = Execution(
                occurrence_id=occurrence_id,
                task_id=task_id,
                task_revision=revision,
                trigger_type=TriggerType.MANUAL,
                trigger_source=source or "",
                idempotency_key=trigger.idempotency_key,
                payload_hash=digest,
                params={**task_params, **(trigger.params or {})},
                max_attempts=max_attempts,
                due_at=now,
                created_at=now,
                updated_at=now,
            )
        order.append(occurrence_id)
    keyed = [occurrence_id for occurrence_id, e in planned.items() if e.idempotency_key is not None]
    existing = existing_executions(keyed) if keyed else {}
    for occurrence_id, execution in existing.items():
        if execution.payload_hash != planned[occurrence_id].payload_hash:
            raise Conflict(KEY_REUSED)
    new = [execution for occurrence_id, execution in planned.items() if occurrence_id not in existing]
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
    reason = f"triggered by {source}" if source else "triggered"
    journal.append(journal.event(execution.sequence, now, "", Status.PENDING, reason) for execution in new)
    results: list[tuple[Execution, bool]] = []
    seen: set[uuid.UUID] = set()
    for occurrence_id in order:
        created = occurrence_id not in existing and occurrence_id not in seen
        seen.add(occurrence_id)
        results.append((existing.get(occurrence_id) or planned[occurrence_id], created))
    return results


def existing_executions(occurrence_ids: list[uuid.UUID]) -> dict[uuid.UUID, Execution]:
    """The executions some of these occurrence ids already have."""
    return {e.occurrence_id: e for e in Execution.objects.filter(occurrence_id__in=occurrence_ids)}
