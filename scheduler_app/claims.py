"""Claiming due executions and recovering expired leases, in short transactions."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import CharField, F, OuterRef, Subquery, Value
from django.db.models.functions import Cast, Concat

from scheduler_app import cron, db, journal, pg_claims
from scheduler_app.models import (
    Execution,
    ExecutionEvent,
    LogPersistence,
    Status,
    Task,
    TriggerType,
)

OVERFETCH = 4


@dataclass(frozen=True)
class Claim:
    """One attempt this runner now owns: the execution as claimed and the task as reread."""

    execution: Execution
    task: Task
    token: str


@dataclass(frozen=True)
class Ended:
    """An execution whose attempt ended outside a worker; ``log_status`` is what its log row shows."""

    execution: Execution
    task_name: str
    log_status: str


def _saturated_task_ids() -> list[str]:
    busy = Execution.objects.occupying().count_by_task()
    if not busy:
        return []
    limits = dict(Task.objects.filter(id__in=list(busy)).values_list("id", "max_concurrency"))
    return [task_id for task_id, n in busy.items() if task_id in limits and n >= limits[task_id]]


def _why_not_runnable(execution: Execution, task: Task | None) -> str | None:
    if task is None:
        return "task deleted"
    if execution.trigger_type == TriggerType.SCHEDULED:
        if not task.enabled:
            return "task disabled"
        try:
            still_due = execution.scheduled_for is not None and cron.matches(
                task.cron, task.timezone, execution.scheduled_for
            )
        except ValueError:
            still_due = False
        if not still_due:
            return "rescheduled: the occurrence no longer matches the cron expression"
    return None


def _candidates(now: datetime, limit: int) -> list[Execution]:
    return list(
        Execution.objects.select_for_update(skip_locked=True)
        .due(now)
        .exclude(task_id__in=_saturated_task_ids())
        .order_by("due_at", "sequence")[:limit]
    )


def _lock_tasks(task_ids: set[str]) -> dict[str, Task]:
    return {
        task.id: task for task in Task.objects.select_for_update(skip_locked=True).filter(id__in=task_ids)
    }


def _busy(task_ids: Iterable[str]) -> dict[str, int]:
    return Execution.objects.filter(task_id__in=list(task_ids)).occupying().count_by_task()


def _take_with_events(
    chosen: list[tuple[Execution, Task]], now: datetime, node: str, lease_until: datetime
) -> list[tuple[Execution, Task]]:
    taken = _take(chosen, now, node, lease_until)
    journal.append(
        journal.event(
            row.sequence, now, Status.PENDING, Status.CLAIMED, "claimed", node=node, attempt=row.attempt
        )
        for row, _ in taken
    )
    return taken


@dataclass(frozen=True)
class Statements:
    """The reads and writes of a claim: due rows locked, their tasks locked, the slots each task
    already fills, and the rows taken (with their claim events)."""

    candidates: Callable[[datetime, int], list[Execution]]
    lock_tasks: Callable[[set[str]], dict[str, Task]]
    busy: Callable[[Iterable[str]], dict[str, int]]
    take: Callable[[list[tuple[Execution, Task]], datetime, str, datetime], list[tuple[Execution, Task]]]


ORM = Statements(_candidates, _lock_tasks, _busy, _take_with_events)
POSTGRES = Statements(pg_claims.candidates, pg_claims.lock_tasks, pg_claims.busy, pg_claims.take)


def claim(now: datetime, node: str, limit: int, lease_seconds: float) -> tuple[list[Claim], list[Ended]]:
    """Claim up to ``limit`` due executions, respecting each task's max_concurrency."""
    if limit <= 0:
        return [], []
    ended: list[Ended] = []
    lease_until = now + timedelta(seconds=lease_seconds)
    statements = POSTGRES if db.server_binding() else ORM
    with transaction.atomic():
        candidates = statements.candidates(now, limit * OVERFETCH)
        if not candidates:
            return [], []
        task_ids = {row.task_id for row in candidates}
        tasks = statements.lock_tasks(task_ids)
        # Rows of tasks another claim holds wait; rows of deleted tasks are ended below.
        unlocked = task_ids - set(tasks)
        existing = (
            set(Task.objects.filter(id__in=unlocked).values_list("id", flat=True)) if unlocked else set()
        )
        # Counted again under the task locks: the hint above may be stale by now.
        busy = statements.busy(tasks)
        free = {task.id: task.max_concurrency - busy.get(task.id, 0) for task in tasks.values()}
        events: list[ExecutionEvent] = []
        chosen: list[tuple[Execution, Task]] = []
        for row in candidates:
            if row.task_id in existing or len(chosen) >= limit:
                continue
            task = tasks.get(row.task_id)
            reason = _why_not_runnable(row, task)
            if reason is not None:
                ended_event = interrupt_pending(row, now, reason, node)
                if ended_event is not None:
                    events.append(ended_event)
                    ended.append(Ended(row, task.name if task else row.task_id, Status.INTERRUPTED))
                continue
            assert task is not None
            if free[task.id] > 0:
                free[task.id] -= 1
                chosen.append((row, task))
        taken = statements.take(chosen, now, node, lease_until) if chosen else []
        journal.append(events)
    return [Claim(row, task, row.execution_token) for row, task in taken], ended


def _take(
    chosen: list[tuple[Execution, Task]], now: datetime, node: str, lease_until: datetime
) -> list[tuple[Execution, Task]]:
    """Move the chosen pending rows to claimed in one UPDATE, each with its own fresh token.

    A token is this claim's random nonce followed by the row's sequence: unique per row, and
    new at every claim, which is all fencing needs; one expression for all rows keeps the
    statement small. The task revision comes from the task rows this transaction has locked.
    """
    if not chosen:
        return []
    nonce = secrets.token_hex(16)
    sequences = [row.sequence for row, _ in chosen]
    taken = Execution.objects.filter(sequence__in=sequences, status=Status.PENDING).update(
        status=Status.CLAIMED,
        owner=node,
        execution_token=Concat(Value(nonce), Cast(F("sequence"), CharField())),
        lease_expires_at=lease_until,
        attempt=F("attempt") + 1,
        task_revision=Subquery(Task.objects.filter(id=OuterRef("task_id")).values("revision")[:1]),
        updated_at=now,
    )
    if taken != len(chosen):
        # Only where rows are not locked (SQLite): keep the rows this UPDATE really took.
        won = set(
            Execution.objects.filter(
                sequence__in=sequences, status=Status.CLAIMED, execution_token__startswith=nonce
            ).values_list("sequence", flat=True)
        )
        chosen = [(row, task) for row, task in chosen if row.sequence in won]
    for row, task in chosen:
        row.status, row.owner, row.execution_token = Status.CLAIMED, node, f"{nonce}{row.sequence}"
        row.lease_expires_at, row.attempt, row.task_revision, row.updated_at = (
            lease_until,
            row.attempt + 1,
            task.revision,
            now,
        )
    return chosen


def interrupt_pending(row: Execution, now: datetime, reason: str, node: str) -> ExecutionEvent | None:
    """End a pending execution without running it; returns the event to append, None if it moved on.

    A retry that waited counts as the attempt it prevents, so the failed
    attempt before it keeps its own log row.
    """
    attempt = row.attempt + 1 if row.attempt else 0
    error = {"reason": reason.split(":", 1)[0], "message": reason}
    fields = {
        "finished_at": now,
        "error": error,
        "attempt": attempt,
        "started_at": None,
        "log_persistence": LogPersistence.PENDING,
    }
    if not Execution.objects.filter(sequence=row.sequence, status=Status.PENDING).update(
        status=Status.INTERRUPTED, updated_at=now, **fields
    ):
        return None
    row.status, row.updated_at, row.finished_at = Status.INTERRUPTED, now, now
    row.error, row.attempt, row.started_at = error, attempt, None
    return journal.event(
        row.sequence, now, Status.PENDING, Status.INTERRUPTED, reason, node=node, attempt=attempt, error=error
    )


def recover_expired(now: datetime, node: str, batch: int = 100) -> list[Ended]:
    """Expired leases: never started -> pending; idempotent with attempts left -> pending; else unknown."""
    ended: list[Ended] = []
    with transaction.atomic():
        rows = list(
            Execution.objects.select_for_update(skip_locked=True)
            .lease_expired(now)
            .order_by("lease_expires_at")[:batch]
        )
        if not rows:
            return []
        tasks = {task.id: task for task in Task.objects.filter(id__in={row.task_id for row in rows})}
        events: list[ExecutionEvent] = []
        for row in rows:
            task = tasks.get(row.task_id)
            released = {"owner": "", "execution_token": "", "lease_expires_at": None, "updated_at": now}
            if row.status == Status.RUNNING:
                released["log_persistence"] = LogPersistence.PENDING
            if row.status == Status.CLAIMED:
                to_status, reason = Status.PENDING, "lease expired before the attempt started"
                fields = {**released, "attempt": row.attempt - 1}
            elif task is not None and task.idempotent and row.attempt < row.max_attempts:
                to_status, reason = Status.PENDING, "lease expired while running; idempotent, will run again"
                fields = {**released, "due_at": now}
            else:
                to_status, reason = Status.UNKNOWN, "lease expired while running; outcome unknown"
                fields = {**released, "finished_at": now}
            lease_error = (
                {"reason": "lease expired", "message": reason} if row.status == Status.RUNNING else None
            )
            if to_status == Status.UNKNOWN:
                fields["error"] = lease_error
            moved = Execution.objects.filter(
                sequence=row.sequence, status=row.status, execution_token=row.execution_token
            ).update(status=to_status, **fields)
            if not moved:
                continue
            events.append(
                journal.event(
                    row.sequence,
                    now,
                    row.status,
                    to_status,
                    reason,
                    node=node,
                    attempt=row.attempt,
                    error=lease_error,
                )
            )
            if row.status == Status.RUNNING:
                row.status, row.finished_at, row.error = to_status, now, lease_error
                ended.append(Ended(row, task.name if task else row.task_id, Status.UNKNOWN))
        journal.append(events)
    return ended
