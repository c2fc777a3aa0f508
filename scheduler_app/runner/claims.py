"""Claiming due executions and recovering expired leases, in short transactions."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction

from scheduler_app import journal, schedule
from scheduler_app.models import (
    BACKFILL_SOURCE,
    Execution,
    ExecutionEvent,
    LogPersistence,
    Status,
    Task,
    TriggerType,
)
from scheduler_app.statements import Statements, journal_statements

# A claim reads this many due rows beyond its limit, locked: room to pass over rows of a task with
# no free slot or held by another claim. Each row read is locked and built, so no more: read in
# proportion to a large limit, they were mostly a busy task's rows it had no slot for.
PASS_OVER = 16


@dataclass(frozen=True)
class Claim:
    """One attempt this runner now owns: the execution as claimed and the task as reread.

    ``started`` says whether the claim also started it (claimed -> running); None when it left
    that to a worker."""

    execution: Execution
    task: Task
    token: str
    started: bool | None = None


@dataclass(frozen=True)
class Ended:
    """An execution whose attempt ended outside a worker; ``log_status`` is what its log row shows."""

    execution: Execution
    task_name: str
    log_status: str


def follows_enqueued_task(execution: Execution, task: Task | None) -> bool:
    """A django_task attempt that stored its task's result id: that task runs on in its backend."""
    return (
        bool(execution.handler_ref) and task is not None and (task.handler or {}).get("kind") == "django_task"
    )


def _held(execution: Execution, task: Task | None) -> bool:
    """A backfilled occurrence of a paused task (models.held_by_pause): it waits in pending for the
    task's resume. The candidates leave these out; a task paused since they were read is seen here."""
    return (
        task is not None
        and not task.enabled
        and execution.trigger_type == TriggerType.SCHEDULED
        and execution.trigger_source == BACKFILL_SOURCE
    )


def _why_not_runnable(execution: Execution, task: Task | None) -> str | None:
    if task is None:
        return "task deleted"
    if follows_enqueued_task(execution, task):
        # Its task was enqueued while the occurrence was runnable: the attempt (a resumed one, or the
        # retry of one that timed out) only follows it.
        return None
    if execution.trigger_type == TriggerType.SCHEDULED:
        if not task.enabled:
            return "task disabled"
        try:
            still_due = execution.scheduled_for is not None and schedule.is_fire_time(
                task, execution.scheduled_for
            )
        except ValueError:
            still_due = False
        if not still_due:
            return "rescheduled: the occurrence is no longer one of the task's fire times"
    return None


def claim(
    now: datetime, node: str, limit: int, lease_seconds: float, *, start: int = 0
) -> tuple[list[Claim], list[Ended], bool]:
    """Claim up to ``limit`` due executions, respecting each task's max_concurrency.

    The first ``start`` rows taken (those a waiting worker runs at once) are also moved to
    running in the claim's transaction: one commit for both moves. The third value is False only
    when no due row can be left for a slot that ends: the claim read fewer rows than it could and
    took or ended each, leaving every task it took a free slot. The candidates leave out the rows
    of tasks at their max_concurrency, so a claim that read none says True."""
    if limit <= 0:
        return [], [], True
    lease_until = now + timedelta(seconds=lease_seconds)
    statements = journal_statements()
    with transaction.atomic():
        candidates = statements.candidates(now, limit + PASS_OVER)
        if not candidates:
            return [], [], True
        choice = _Choice(statements, now, node, limit)
        # The tasks of the first ``limit`` rows, then, if they did not fill the claim, those of the
        # rest: in a burst of due tasks each claim locks and reads only the tasks it takes.
        choice.decide(candidates[:limit])
        if not choice.full():
            choice.decide(candidates[limit:])
        taken = statements.take(choice.chosen, now, node, lease_until, start=start) if choice.chosen else []
        journal.append(choice.events)
    claimed = [
        Claim(row, task, row.execution_token, started=row.status == Status.RUNNING if n < start else None)
        for n, (row, task) in enumerate(taken)
    ]
    left_due = (
        len(candidates) >= limit + PASS_OVER
        or len(taken) + len(choice.ended) < len(candidates)
        or any(free <= 0 for free in choice.free.values())
    )
    return claimed, choice.ended, left_due


class _Choice:
    """The rows one claim takes or ends, decided under the locks of their tasks."""

    def __init__(self, statements: Statements, now: datetime, node: str, limit: int) -> None:
        self.statements, self.now, self.node, self.limit = statements, now, node, limit
        self.tasks: dict[str, Task] = {}  # locked by this claim
        self.elsewhere: set[str] = set()  # held by another claim: their rows wait
        self.deleted: set[str] = set()
        self.free: dict[str, int] = {}
        self.chosen: list[tuple[Execution, Task]] = []
        self.events: list[ExecutionEvent] = []
        self.ended: list[Ended] = []

    def full(self) -> bool:
        return len(self.chosen) >= self.limit

    def decide(self, rows: list[Execution]) -> None:
        self._lock({row.task_id for row in rows} - set(self.tasks) - self.elsewhere - self.deleted)
        for row in rows:
            if row.task_id in self.elsewhere or self.full():
                continue
            task = self.tasks.get(row.task_id)
            if _held(row, task):
                continue
            reason = _why_not_runnable(row, task)
            if reason is not None:
                ended_event = journal.interrupt_pending(row, self.now, reason, self.node)
                if ended_event is not None:
                    self.events.append(ended_event)
                    self.ended.append(Ended(row, task.name if task else row.task_id, Status.INTERRUPTED))
                continue
            assert task is not None
            if self.free[task.id] > 0:
                self.free[task.id] -= 1
                self.chosen.append((row, task))

    def _lock(self, task_ids: set[str]) -> None:
        if not task_ids:
            return
        locked = self.statements.lock_tasks(task_ids)
        unlocked = task_ids - set(locked)
        existing = (
            set(Task.objects.filter(id__in=unlocked).values_list("id", flat=True)) if unlocked else set()
        )
        self.elsewhere |= existing
        self.deleted |= unlocked - existing
        self.tasks.update(locked)
        # Counted again under the task locks: the candidates' hint may be stale by now.
        busy = self.statements.busy(locked) if locked else {}
        self.free.update({task.id: task.max_concurrency - busy.get(task.id, 0) for task in locked.values()})


def recover_expired(now: datetime, node: str, batch: int = 100) -> list[Ended]:
    """Expired leases: never started -> pending; following an enqueued task -> pending, the same attempt;
    idempotent with attempts left -> pending; else unknown."""
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
            released = {**journal.released(), "updated_at": now}
            # A django_task attempt that stored its result id has no effect left to repeat: its task
            # runs on in the tasks backend, and the next claim follows it as the same attempt.
            following = row.status == Status.RUNNING and follows_enqueued_task(row, task)
            if row.status == Status.RUNNING and not following:
                released["log_persistence"] = LogPersistence.PENDING
            if row.status == Status.CLAIMED:
                to_status, reason = Status.PENDING, "lease expired before the attempt started"
                fields = {**released, "attempt": row.attempt - 1}
            elif following:
                to_status, reason = Status.PENDING, journal.FOLLOW_AFTER_LEASE
                fields = {**released, "attempt": row.attempt - 1, "due_at": now}
            elif task is not None and task.idempotent and row.attempt < row.max_attempts:
                to_status, reason = Status.PENDING, "lease expired while running; idempotent, will run again"
                # Its attempt has no outcome: the error of an earlier failed attempt is not its.
                fields = {**released, "due_at": now, "error": None}
            else:
                to_status, reason = Status.UNKNOWN, "lease expired while running; outcome unknown"
                fields = {**released, "finished_at": now}
            lease_error = (
                {"reason": "lease expired", "message": reason}
                if row.status == Status.RUNNING and not following
                else None
            )
            if to_status == Status.UNKNOWN:
                fields["error"] = lease_error
            moved = Execution.objects.filter(
                journal.owned(row.execution_token, row.status), sequence=row.sequence
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
            if row.status == Status.RUNNING and not following:
                row.status, row.finished_at, row.error = to_status, now, lease_error
                ended.append(Ended(row, task.name if task else row.task_id, Status.UNKNOWN))
        journal.append(events)
    return ended
