"""The journal's statements through the ORM, for every database Django supports; the interface
the PostgreSQL statements (``scheduler_app.postgres.statements``) implement too."""

from __future__ import annotations

import json
import secrets
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connection, transaction
from django.db.models import Case, CharField, F, Field, OuterRef, Subquery, Value, When
from django.db.models.functions import Cast, Concat

from scheduler_app import journal, logs
from scheduler_app.models import Execution, Status, Task, held_by_pause

if TYPE_CHECKING:
    from scheduler_app.runner.claims import Claim
    from scheduler_app.runner.recording import Finish

# The database's clock, as the probe reads it (UTC; the text goes through %-formatting).
CLOCK_SQL = {
    "postgresql": "statement_timestamp()",
    "mysql": "UTC_TIMESTAMP(6)",
    "sqlite": "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')",
}

# Above this many distinct next_run_at values, one UPDATE with a per-row CASE instead.
DISTINCT_UPDATES = 8


class Statements:
    """The ORM's statements, for every database Django supports.

    A claim's reads and writes run in the claim's transaction; the batches of starts and of
    outcomes each take a transaction of their own. ``lone_batches`` says whether a batch of one
    is worth this path (a statement per batch saves round trips even for one attempt), or a lone
    attempt takes the one-attempt path with its retries.
    """

    lone_batches = False

    def writes_one_at_a_time(self, connection: Any) -> bool:
        """Whether the database takes one write at a time (SQLite): more worker threads only queue."""
        return bool(connection.vendor == "sqlite")

    def estimated_rows(self, connection: Any, table: str) -> int | None:
        """The database's estimate of a table's rows, from its statistics; None where it keeps
        none worth reading (then a list counts, bounded)."""
        return None

    def wake_ups(self) -> Any:
        """How triggers wake runners through the database itself (``postgres/notify.py``: a
        ``SENDER`` and a ``Listener``), or None: through Redis, or at the next tick."""
        return None

    def clock_sql(self, connection: Any) -> str:
        """The SQL expression of the database's current time, for the runner's probe."""
        return CLOCK_SQL[connection.vendor]

    @contextmanager
    def kept_plans(self) -> Iterator[None]:
        """Within, this thread's statements keep their plans, made again as the journal grows (a
        runner's loop and journal writer); nothing to do where statements are not prepared."""
        yield

    @contextmanager
    def cursor(self, connection: Any) -> Iterator[Any]:
        """A cursor for the runner's probe."""
        with connection.cursor() as cursor:
            yield cursor

    # -- a claim, inside its transaction --------------------------------------------------

    def candidates(self, now: datetime, limit: int) -> list[Execution]:
        """Due rows (pending and due, or leases expired) of tasks with a free slot, locked, oldest first."""
        return list(
            Execution.objects.select_for_update(skip_locked=True)
            .due(now)
            .exclude(task_id__in=_saturated_task_ids())
            .exclude(held_by_pause())
            .order_by("due_at", "sequence")[:limit]
        )

    def lock_tasks(self, task_ids: set[str]) -> dict[str, Task]:
        """The tasks no other claim holds, locked."""
        return {
            task.id: task for task in Task.objects.select_for_update(skip_locked=True).filter(id__in=task_ids)
        }

    def busy(self, task_ids: Iterable[str]) -> dict[str, int]:
        """How many executions of each task fill a slot (claimed, running or unknown)."""
        return Execution.objects.filter(task_id__in=list(task_ids)).occupying().count_by_task()

    def take(
        self,
        chosen: list[tuple[Execution, Task]],
        now: datetime,
        node: str,
        lease_until: datetime,
        *,
        start: int = 0,
    ) -> list[tuple[Execution, Task]]:
        """Move the chosen pending rows to claimed, each with a fresh token, and append the claim
        events; then the first ``start`` rows taken on to running, as ``start_batch`` would (those
        asked to stop stay claimed). The rows taken, as they are now."""
        taken = _take(chosen, now, node, lease_until)
        journal.append(
            journal.event(
                row.sequence, now, Status.PENDING, Status.CLAIMED, "claimed", node=node, attempt=row.attempt
            )
            for row, _ in taken
        )
        if start > 0 and taken:
            first = [row for row, _ in taken[:start]]
            started = self._start(
                [(row.sequence, row.execution_token, row.attempt) for row in first], node, now
            )
            for row in first:
                if row.sequence in started:
                    row.status, row.started_at = Status.RUNNING, now
        return taken

    # -- the journal writer's batches ---------------------------------------------------------

    def start_batch(self, claimed: Sequence[Claim], node: str, now: datetime) -> set[int]:
        """claimed -> running for every claim still owned and not asked to stop; the sequences moved."""
        return self._start([(c.execution.sequence, c.token, c.execution.attempt) for c in claimed], node, now)

    def _start(self, rows: Sequence[tuple[int, str, int]], node: str, now: datetime) -> set[int]:
        """``start_batch`` of (sequence, token, attempt) rows."""
        with transaction.atomic():
            current = journal.lock_rows(sequence for sequence, _, _ in rows)
            starts = [row for row in rows if journal.holds(current.get(row[0]), row[1], Status.CLAIMED)]
            if starts:
                Execution.objects.filter(sequence__in=[sequence for sequence, _, _ in starts]).update(
                    status=Status.RUNNING, started_at=now, updated_at=now
                )
                journal.append(
                    journal.event(
                        sequence, now, Status.CLAIMED, Status.RUNNING, "started", node=node, attempt=attempt
                    )
                    for sequence, _, attempt in starts
                )
        return {sequence for sequence, _, _ in starts}

    def finish_batch(self, finishes: Sequence[Finish], node: str, now: datetime) -> set[int]:
        """Record every planned outcome whose row is still owned, with the log rows that share
        its commit; the sequences recorded."""
        with transaction.atomic():
            current = journal.lock_rows(f.attempt.claim.execution.sequence for f in finishes)
            owned = [
                f
                for f in finishes
                if journal.holds(
                    current.get(f.attempt.claim.execution.sequence),
                    f.attempt.claim.token,
                    f.from_status,
                    # An outcome that registers a result is refused once a stop was requested.
                    starting=f.outcome.status not in (Status.INTERRUPTED, Status.UNKNOWN),
                )
            ]
            if owned:
                logs.write([f.log for f in owned if f.log_with_outcome])
                _record_outcomes(owned)
                journal.append(
                    journal.event(
                        f.attempt.claim.execution.sequence,
                        now,
                        f.from_status,
                        f.to_status,
                        f.reason,
                        node=node,
                        attempt=f.attempt.claim.execution.attempt,
                        result=f.outcome.result,
                        error=f.outcome.error,
                    )
                    for f in owned
                )
        return {f.attempt.claim.execution.sequence for f in owned}

    # -- scheduled occurrences ------------------------------------------------------------------

    def move_next_runs(self, tasks: Sequence[Task]) -> None:
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

    def insert_scheduled(
        self, rows: Sequence[tuple[Execution, str]], node: str, now: datetime
    ) -> list[Execution]:
        """Insert new scheduled occurrences, each with its creation event (``reason``); those whose
        occurrence id exists already are left out. The inserted ones, with their sequence."""
        reasons = {execution.occurrence_id: reason for execution, reason in rows}
        created = _insert([execution for execution, _ in rows])
        journal.append(
            journal.event(e.sequence, now, "", e.status, reasons[e.occurrence_id], node=node, error=e.error)
            for e in created
        )
        return created

    # -- a manual trigger ---------------------------------------------------------------------

    def insert_manual(
        self, execution: Execution, caller_params: dict[str, Any], reason: str, now: datetime, wake: bool
    ) -> bool:
        """Insert a manual trigger's execution and event in one statement, where there is one; False
        (nothing written) sends the caller to the ORM path, which tells the refusals apart. ``wake``:
        the statement also sends the runners' wake-up, at its commit (``wakeup.carry``)."""
        return False

    def insert_manual_many(
        self,
        task_id: str,
        source: str,
        planned: list[Execution],
        keyed: list[Any],
        reason: str,
        now: datetime,
    ) -> tuple[list[Execution], list[Any]] | None:
        """Insert a batch of one task's manual triggers in one statement, where there is one: the
        executions inserted and the occurrence ids left out (their key was used before with the same
        params). None (nothing written) sends the caller to the ORM path of ``scheduler_app.triggers``."""
        return None


def _insert(executions: list[Execution]) -> list[Execution]:
    """Insert in one statement where the database returns the new keys, else row by row; a row
    whose occurrence id exists is left out."""
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


def _saturated_task_ids() -> list[str]:
    busy = Execution.objects.occupying().count_by_task()
    if not busy:
        return []
    limits = dict(Task.objects.filter(id__in=list(busy)).values_list("id", "max_concurrency"))
    return [task_id for task_id, n in busy.items() if task_id in limits and n >= limits[task_id]]


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


def _record_outcomes(finishes: list[Finish]) -> None:
    """One UPDATE for all outcomes (rows already locked and owned)."""
    columns: dict[str, dict[int, Any]] = defaultdict(dict)
    for f in finishes:
        sequence = f.attempt.claim.execution.sequence
        for column, value in f.columns().items():
            columns[column][sequence] = value
    sequences = [f.attempt.claim.execution.sequence for f in finishes]
    Execution.objects.filter(sequence__in=sequences).update(
        **{column: _per_row(column, values, len(sequences)) for column, values in columns.items()}
    )


def _per_row(column: str, values: dict[int, Any], rows: int) -> Any:
    """A column's new value per row as one expression; rows without a value keep theirs."""
    output = Execution._meta.get_field(column)
    assert isinstance(output, Field)
    groups: dict[str, tuple[Any, list[int]]] = {}
    for sequence, value in values.items():
        key = json.dumps(value, sort_keys=True, default=str)
        groups.setdefault(key, (value, []))[1].append(sequence)
    if len(groups) == 1 and len(values) == rows:
        ((value, _),) = groups.values()
        return Value(value, output_field=output)
    whens = [
        When(sequence__in=members, then=Value(value, output_field=output))
        for value, members in groups.values()
    ]
    return Case(*whens, default=F(column), output_field=output)


ORM = Statements()
