"""Execution logs: a projection of the journal, written after it and rebuilt from it."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime

from django.db import DatabaseError, connections, transaction

from scheduler_app import journal
from scheduler_app.conf import scheduler_settings
from scheduler_app.models import (
    Execution,
    ExecutionEvent,
    ExecutionLog,
    LogPersistence,
    Status,
    Task,
    log_id,
)

logger = logging.getLogger("scheduler_app")

# Named in the runner's warning when a log write fails; never stored (docs/api.md says why).
LOG_PERSISTENCE_FAILED = "scheduler:032"

LOG_FIELDS = [
    "occurrence_id",
    "task_id",
    "task_name",
    "trigger_type",
    "trigger_source",
    "status",
    "result",
    "error",
    "attempt",
    "started_at",
    "finished_at",
    "duration_ms",
]


def log_alias() -> str:
    alias: str = scheduler_settings.LOG_DATABASE or "default"
    return alias


def attempt_status(event: ExecutionEvent) -> str | None:
    """The status a log row shows for the attempt this event ends, or None."""
    if event.to_status in (
        Status.SUCCESS,
        Status.FAILED,
        Status.INTERRUPTED,
        Status.UNKNOWN,
        Status.DISCARDED,
    ):
        return event.to_status
    if event.from_status == Status.RUNNING and event.to_status == Status.PENDING:
        if event.reason in journal.RESUMED:
            return None
        return Status.FAILED if event.error and event.reason.startswith("retry") else Status.UNKNOWN
    return None


def build_log(
    execution: Execution,
    task_name: str,
    attempt: int,
    status: str,
    started_at: datetime | None,
    finished_at: datetime,
    result: object,
    error: object,
) -> ExecutionLog:
    duration = None
    if started_at is not None:
        duration = max(0, int((finished_at - started_at).total_seconds() * 1000))
    return ExecutionLog(
        id=log_id(execution.occurrence_id, attempt),
        occurrence_id=execution.occurrence_id,
        task_id=execution.task_id,
        task_name=task_name[:200],
        trigger_type=execution.trigger_type,
        trigger_source=execution.trigger_source,
        status=status,
        result=result,
        error=error,
        attempt=attempt,
        started_at=started_at,
        finished_at=finished_at,
        duration_ms=duration,
    )


def project(execution: Execution, events: Iterable[ExecutionEvent], task_name: str) -> list[ExecutionLog]:
    """The log rows the journal implies: one per finished attempt, its latest outcome."""
    started: dict[int, datetime] = {}
    rows: dict[int, ExecutionLog] = {}
    for item in events:
        if item.to_status == Status.RUNNING:
            started[item.attempt] = item.at
            continue
        status = attempt_status(item)
        if status is None:
            continue
        previous = rows.get(item.attempt)
        result = item.result if item.result is not None or previous is None else previous.result
        error = item.error if item.error is not None or previous is None else previous.error
        rows[item.attempt] = build_log(
            execution, task_name, item.attempt, status, started.get(item.attempt), item.at, result, error
        )
    return [rows[attempt] for attempt in sorted(rows)]


def ids_of(occurrence_id: uuid.UUID, attempts: int) -> list[uuid.UUID]:
    """The ids the log rows of an occurrence that reached ``attempts`` can have: one per attempt, and
    attempt 0 for an execution ended before it ran."""
    return [log_id(occurrence_id, attempt) for attempt in range(attempts + 1)]


def write(rows: Sequence[ExecutionLog]) -> None:
    """Insert or overwrite log rows by their deterministic ids."""
    if not rows:
        return
    alias = log_alias()
    options: dict[str, object] = {"update_conflicts": True, "update_fields": LOG_FIELDS}
    if connections[alias].features.supports_update_conflicts_with_target:
        options["unique_fields"] = ["id"]
    ExecutionLog.objects.using(alias).bulk_create(list(rows), **options)  # type: ignore[arg-type]


def write_and_confirm(execution: Execution, rows: Sequence[ExecutionLog]) -> bool:
    """Write the rows, then mark the execution persisted if no later attempt started since."""
    if execution.attempt > 1:
        # Rows of earlier attempts may be missing: rebuild them all, so a lost row heals
        # here and no unwritten row is ever confirmed.
        return rebuild_and_confirm(execution)
    try:
        write(rows)
    except DatabaseError:
        logger.warning(
            "%s log write failed for %s; left pending for repair",
            LOG_PERSISTENCE_FAILED,
            execution.occurrence_id,
        )
        return False
    Execution.objects.filter(sequence=execution.sequence, attempt=execution.attempt).exclude(
        status__in=(Status.CLAIMED, Status.RUNNING)
    ).update(log_persistence=LogPersistence.PERSISTED)
    return True


def rebuild_and_confirm(execution: Execution) -> bool:
    """Rebuild every log row of an execution from its journal; False if the log database refused."""
    try:
        repair(execution.occurrence_id)
    except DatabaseError:
        logger.warning(
            "%s log write failed for %s; left pending for repair",
            LOG_PERSISTENCE_FAILED,
            execution.occurrence_id,
        )
        return False
    return True


def repair(occurrence_id: uuid.UUID) -> list[ExecutionLog]:
    """Rebuild one execution's log rows from its journal; serialised per execution."""
    with transaction.atomic():
        execution = Execution.objects.select_for_update().get(occurrence_id=occurrence_id)
        events = list(ExecutionEvent.objects.filter(execution_id=execution.sequence).order_by("id"))
        task_name = Task.objects.filter(id=execution.task_id).values_list("name", flat=True).first()
        alias = log_alias()
        stored = ExecutionLog.objects.using(alias).filter(
            id__in=ids_of(execution.occurrence_id, execution.attempt)
        )
        if task_name is None:
            task_name = stored.values_list("task_name", flat=True).first() or execution.task_id
        rows = project(execution, events, task_name)
        with transaction.atomic(using=alias):
            write(rows)
            stored.exclude(id__in=[row.id for row in rows]).delete()
        Execution.objects.filter(sequence=execution.sequence).update(log_persistence=LogPersistence.PERSISTED)
    return rows
