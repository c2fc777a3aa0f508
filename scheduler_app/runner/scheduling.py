"""Turning due cron minutes into occurrences: misfire grace, coalescing and overlap."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, connection, transaction

from scheduler_app import cron, journal
from scheduler_app.conf import scheduler_settings
from scheduler_app.models import (
    Execution,
    Overlap,
    Status,
    Task,
    TriggerType,
    scheduled_occurrence_id,
)

BATCH = 200
# Above this many distinct next_run_at values, one UPDATE with a per-row CASE instead.
DISTINCT_UPDATES = 8
logger = logging.getLogger("scheduler_app")
ONE_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True)
class Plan:
    """What one due task gets at ``now``."""

    fire: datetime | None
    missed: int
    missed_first: datetime | None
    missed_last: datetime | None
    next_run_at: datetime


def plan(task: Task, now: datetime, default_grace: int) -> Plan:
    """Fire times since ``task.next_run_at``: the latest within grace runs, older ones are missed."""
    assert task.next_run_at is not None
    grace = task.misfire_grace_seconds if task.misfire_grace_seconds is not None else default_grace
    cutoff = now - timedelta(seconds=grace)
    start = task.next_run_at - ONE_MICROSECOND
    within = cron.fire_times(task.cron, task.timezone, max(start, cutoff - ONE_MICROSECOND), now)
    missed = first = last = None
    if start < cutoff - ONE_MICROSECOND:
        missed = cron.count_fire_times(task.cron, task.timezone, start, cutoff - ONE_MICROSECOND)
        if missed:
            first = cron.next_fire_time(task.cron, task.timezone, start)
            last = _last_fire_before(task, cutoff, start)
    return Plan(
        fire=within[-1] if within else None,
        missed=missed or 0,
        missed_first=first,
        missed_last=last,
        next_run_at=cron.next_fire_time(task.cron, task.timezone, now),
    )


def _last_fire_before(task: Task, cutoff: datetime, floor: datetime) -> datetime | None:
    """The latest fire time in (floor, cutoff), found in windows that double backwards."""
    window = timedelta(hours=1)
    while True:
        low = max(floor, cutoff - window)
        found = cron.fire_times(task.cron, task.timezone, low, cutoff - ONE_MICROSECOND)
        if found or low == floor:
            return found[-1] if found else None
        window *= 2


def _new_execution(task: Task, scheduled_for: datetime, now: datetime, status: str) -> Execution:
    return Execution(
        occurrence_id=scheduled_occurrence_id(task.id, scheduled_for),
        task_id=task.id,
        task_revision=task.revision,
        trigger_type=TriggerType.SCHEDULED,
        trigger_source="cron",
        scheduled_for=scheduled_for,
        due_at=scheduled_for,
        params=dict(task.params),
        status=status,
        max_attempts=task.retry_max_attempts,
        created_at=now,
        updated_at=now,
        finished_at=now if status == Status.INTERRUPTED else None,
    )


def _insert(executions: list[Execution]) -> list[Execution]:
    """Insert new occurrences; the unique occurrence_id makes a repeated insert a no-op."""
    if connection.features.can_return_rows_from_bulk_insert:
        try:
            with transaction.atomic():
                return Execution.objects.bulk_create(executions)
        except IntegrityError:
            pass
    created = []
    for execution in executions:
        try:
            with transaction.atomic():
                execution.save(force_insert=True)
        except IntegrityError:
            continue
        created.append(execution)
    return created


def _move_next_run(tasks: list[Task]) -> None:
    """Store each task's new next_run_at: one UPDATE per distinct instant, as tasks that fired
    together mostly fire next together; a per-row CASE only when the instants are many."""
    by_instant: dict[datetime | None, list[str]] = {}
    for task in tasks:
        by_instant.setdefault(task.next_run_at, []).append(task.id)
    if len(by_instant) > DISTINCT_UPDATES:
        Task.objects.bulk_update(tasks, ["next_run_at"])
        return
    for instant, ids in by_instant.items():
        Task.objects.filter(id__in=ids).update(next_run_at=instant)


def schedule_due(now: datetime, node: str) -> tuple[list[tuple[Execution, str, str]], bool]:
    """Create the occurrences of up to one batch of tasks due at ``now``.

    Returns (execution, task name, reason) for each occurrence created, and
    whether more tasks may be due. Task rows are locked with SKIP LOCKED, so
    each due task is planned by one runner, and next_run_at moves forward in
    the same transaction.
    """
    default_grace = int(scheduler_settings.MISFIRE_GRACE_SECONDS)
    with transaction.atomic():
        tasks = list(
            Task.objects.select_for_update(skip_locked=True)
            .filter(enabled=True, next_run_at__lte=now)
            .order_by("next_run_at")[:BATCH]
        )
        if not tasks:
            return [], False
        ids = [task.id for task in tasks]
        occupied = Execution.objects.filter(task_id__in=ids).occupying().count_by_task()
        waiting = Execution.objects.filter(
            task_id__in=ids, status=Status.PENDING, trigger_type=TriggerType.SCHEDULED
        ).count_by_task()
        rows: list[tuple[Execution, str, str]] = []
        for task in tasks:
            try:
                step = plan(task, now, default_grace)
            except ValueError:
                # A definition stored around validation (raw SQL, a bad fixture) must not stall the others.
                logger.error("task %s has an invalid schedule; it will not fire until fixed", task.id)
                task.next_run_at = None
                continue
            if step.missed and step.missed_first and step.missed_last:
                reason = (
                    f"misfire: missed {step.missed} fire time{'s' if step.missed != 1 else ''} between "
                    f"{step.missed_first:%Y-%m-%dT%H:%MZ} and {step.missed_last:%Y-%m-%dT%H:%MZ}"
                )
                rows.append(
                    (_new_execution(task, step.missed_first, now, Status.INTERRUPTED), task.name, reason)
                )
            if step.fire is not None:
                busy = occupied.get(task.id, 0) + waiting.get(task.id, 0)
                room = task.max_concurrency + (1 if task.overlap == Overlap.BUFFER_ONE else 0)
                if busy < room:
                    rows.append(
                        (_new_execution(task, step.fire, now, Status.PENDING), task.name, "scheduled")
                    )
                    waiting[task.id] = waiting.get(task.id, 0) + 1
                else:
                    overlap = f"overlap: {task.max_concurrency} running or waiting, policy {task.overlap}"
                    rows.append(
                        (_new_execution(task, step.fire, now, Status.INTERRUPTED), task.name, overlap)
                    )
            task.next_run_at = step.next_run_at
        for execution, _, reason in rows:
            if execution.status == Status.INTERRUPTED:
                execution.error = {"reason": reason.split(":", 1)[0], "message": reason}
        _move_next_run(tasks)
        inserted = {row.occurrence_id for row in _insert([execution for execution, _, _ in rows])}
        created = [row for row in rows if row[0].occurrence_id in inserted]
        journal.append(
            journal.event(
                execution.sequence, now, "", execution.status, reason, node=node, error=execution.error
            )
            for execution, _, reason in created
        )
    return created, len(tasks) >= BATCH
