"""The claim's statements on PostgreSQL: fixed texts with server-bound parameters.

``runner.claims.claim`` decides which rows to take; these four statements read
and write for it in its transaction. Built through the ORM, they cost several
milliseconds of Python per claim, more than the database spends on them, and
a busy runner claims dozens of times a second. Each does what its ORM
counterpart in ``statements.orm.Statements`` does, and the claim tests run
against both.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from datetime import datetime
from functools import cache
from typing import Any, TypeVar

from django.db.models import Model

from scheduler_app import journal
from scheduler_app.models import (
    BACKFILL_SOURCE,
    LEASED,
    OCCUPYING,
    Execution,
    ExecutionEvent,
    Status,
    Task,
    TriggerType,
    built,
)
from scheduler_app.postgres import binding
from scheduler_app.sql import status_literal

M = TypeVar("M", bound=Model)


@cache
def _names() -> dict[str, str]:
    quote = binding.journal_connection().ops.quote_name
    return {
        "execution": binding.table(Execution),
        "task": binding.table(Task),
        "event": binding.table(ExecutionEvent),
        "execution_columns": ", ".join(f"e.{quote(f.column)}" for f in Execution._meta.concrete_fields),
        "task_columns": ", ".join(f"t.{quote(f.column)}" for f in Task._meta.concrete_fields),
    }


def _fetch(
    model: type[M],
    sql: str,
    params: list[Any],
    names: Sequence[str] | None = None,
    *,
    newest_last: bool = False,
) -> list[M]:
    """Model instances from rows of ``model``'s columns ``names`` (all by default), in that order,
    converted as the ORM would; columns left out are deferred. ``newest_last``: each row ends with
    the journal's newest sequence, for the runner's kept plans (``binding.saw``)."""
    connection = binding.journal_connection()
    fields = list(model._meta.concrete_fields)
    if names:
        by_name = {f.attname: f for f in fields}
        fields = [by_name[name] for name in names]
    converters = [(i, c) for i, f in enumerate(fields) for c in f.get_db_converters(connection)]
    with binding.bound_cursor(connection) as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    attnames = [f.attname for f in fields]
    out = []
    for row in rows:
        values = list(row[: len(fields)])
        for i, convert in converters:
            values[i] = convert(values[i], fields[i], connection)
        out.append(built(model, dict(zip(attnames, values, strict=True)), db=connection.alias))
    if newest_last and rows:
        binding.saw(rows[0][-1])
    return out


# What the claim decides with; rows it takes come back whole from the UPDATE. A row it ends
# without running (interrupt_pending) loads the rest on use.
CANDIDATE_FIELDS = (
    "sequence",
    "occurrence_id",
    "task_id",
    "trigger_type",
    "trigger_source",
    "scheduled_for",
    "attempt",
    "handler_ref",
)


# Rows that fill a slot of their task, as the predicate of the partial index
# scheduler_execution_occupying (task_id, status; migration 0001): a task's are found by its id,
# however many other tasks have leased or unknown rows.
OCCUPYING_ROWS = f"o.status IN {status_literal(*OCCUPYING)}"
# A task's unknown rows through the same index, and through it only: the second test bounds the
# index's status from below, so that its leased entries are skipped without being read (claimed and
# running sort before unknown), and a proof that only unknown rows match, which would let
# PostgreSQL read them all through scheduler_execution_unknown, cannot be made from it.
assert all(status < Status.UNKNOWN for status in LEASED)
UNKNOWN_ROWS = f"{OCCUPYING_ROWS} AND o.status > {status_literal(Status.RUNNING)}"


def candidates(now: datetime, limit: int) -> list[Execution]:
    """Due pending rows not locked by another claim, oldest first, skipping tasks already at their
    max_concurrency (a hint: ``busy`` counts again under the task locks)."""
    rows = _fetch(Execution, candidates_sql(), [now, limit], CANDIDATE_FIELDS, newest_last=True)
    for row in rows:
        row.status = Status.PENDING
    return rows


@cache
def candidates_sql() -> str:
    n = _names()
    return (
        f"SELECT {', '.join(f'e.{name}' for name in CANDIDATE_FIELDS)},"
        # The journal's newest row: the runner's kept plans are made again as it grows (binding.saw).
        f" (SELECT MAX(n.sequence) FROM {n['execution']} n) FROM {n['execution']} e"
        f" WHERE e.status = {status_literal(Status.PENDING)} AND e.due_at <= %s"
        # A task is full when its leased and unknown rows reach its max_concurrency. Leased rows
        # are the live queue: counted for all tasks at once, and a full task's many due rows (a
        # burst of triggers) are passed over by a lookup in that set.
        f" AND e.task_id NOT IN (SELECT o.task_id FROM {n['execution']} o"
        f" WHERE o.status IN {status_literal(*LEASED)} GROUP BY o.task_id"
        # Each busy task's limit looked up by its key: joined instead, PostgreSQL merged the
        # occupying rows with an index read of every task (100,000 of them: 20-75 ms a claim).
        f" HAVING COUNT(*) >= (SELECT t.max_concurrency FROM {n['task']} t WHERE t.id = o.task_id))"
        # Then each remaining candidate's task, by its id: with no unknown row its leased rows are
        # below its limit (above); with some, its leased and unknown rows are counted against it.
        # Both read through the partial index of occupying rows, the one index whose predicate they
        # match. Asked instead whether the task had an unknown row (NOT EXISTS), PostgreSQL, with
        # statistics whose sample held none of the journal's rare unknown rows, read all of them
        # for each candidate (13-22 ms a claim in bench/scale.py); counting every candidate's
        # occupying rows read a busy task's leased rows once per candidate (1.5 ms a claim of a
        # bulk trigger, bench/trigger_many.py). A deleted task's rows pass: the claim ends them.
        f" AND COALESCE((SELECT COUNT(*) FROM {n['execution']} o WHERE o.task_id = e.task_id AND {UNKNOWN_ROWS}) = 0"
        f" OR (SELECT COUNT(*) FROM {n['execution']} o WHERE o.task_id = e.task_id AND {OCCUPYING_ROWS})"
        f" < (SELECT b.max_concurrency FROM {n['task']} b WHERE b.id = e.task_id), TRUE)"
        # Backfilled rows of paused tasks wait (models.held_by_pause); only they pay the lookup.
        f" AND NOT (e.trigger_source = '{BACKFILL_SOURCE}' AND e.trigger_type = '{TriggerType.SCHEDULED.value}'"
        f" AND EXISTS (SELECT 1 FROM {n['task']} p WHERE p.id = e.task_id AND NOT p.enabled))"
        " ORDER BY e.due_at, e.sequence LIMIT %s FOR UPDATE OF e SKIP LOCKED"
    )


def lock_tasks(task_ids: Iterable[str]) -> dict[str, Task]:
    """The tasks no other claim holds, locked until the claim commits."""
    n = _names()
    sql = f"SELECT {n['task_columns']} FROM {n['task']} t WHERE t.id = ANY(%s) FOR UPDATE OF t SKIP LOCKED"
    return {task.id: task for task in _fetch(Task, sql, [list(task_ids)])}


def busy(task_ids: Iterable[str]) -> dict[str, int]:
    """How many executions of each task occupy a slot; a statement of its own, after the task
    locks, so that it sees every claim committed before them."""
    n = _names()
    # Through the partial index of occupying rows, by task: not the task index, which holds every
    # row of a task's history.
    sql = (
        f"SELECT o.task_id, COUNT(*) FROM {n['execution']} o"
        f" WHERE o.task_id = ANY(%s::text[]) AND {OCCUPYING_ROWS} GROUP BY o.task_id"
    )
    with binding.bound_cursor(binding.journal_connection()) as cursor:
        cursor.execute(sql, [list(task_ids)])
        return dict(cursor.fetchall())


@cache
def _take_sql() -> str:
    n = _names()
    # The rows a waiting worker runs at once (not those asked to stop) go on to running in the
    # same move: one row version and one statement fewer than a start after the claim.
    starting = "e.sequence = ANY(%s::bigint[]) AND NOT e.stop_requested"
    return (
        f"WITH u AS (UPDATE {n['execution']} e SET status = CASE WHEN {starting} THEN %s ELSE %s END,"
        " owner = %s, execution_token = %s || e.sequence::text, lease_expires_at = %s,"
        " attempt = e.attempt + 1,"
        # The revision of the task this claim locked, looked up by its key for each row.
        f" task_revision = COALESCE((SELECT t.revision FROM {n['task']} t WHERE t.id = e.task_id),"
        f" e.task_revision), updated_at = %s, started_at = CASE WHEN {starting} THEN %s ELSE e.started_at END"
        # The rows by their key only, the one index that can find them. Joined with the task
        # table, or tested for their status (the candidates read locked them pending, and nothing
        # moves them before this transaction ends), they let PostgreSQL, with statistics taken on
        # an empty journal, read every pending row of a burst at each claim: through the partial
        # index of pending rows, or through the task's index of its whole history.
        f" WHERE e.sequence = ANY(%s::bigint[]) RETURNING {n['execution_columns']}),"
        # The claim's event of each row, then the start's of those started, in that order.
        f" i AS (INSERT INTO {n['event']} (execution_id, at, from_status, to_status, reason, node, attempt)"
        " SELECT sequence, %s, %s, %s, 'claimed', %s, attempt FROM u"
        " UNION ALL SELECT sequence, %s, %s, %s, 'started', %s, attempt FROM u WHERE status = %s)"
        " SELECT * FROM u"
    )


def take(
    chosen: list[tuple[Execution, Task]], now: datetime, node: str, lease_until: datetime, *, start: int = 0
) -> list[tuple[Execution, Task]]:
    """pending -> claimed for the chosen rows, each with a fresh token, and the first ``start`` of
    them on to running, with their events; as ``Statements.take`` on the ORM. The rows taken, whole
    and as they are now, with their tasks."""
    starting = [row.sequence for row, _ in chosen[:start]]
    event_node = node[: journal.NODE_LENGTH]
    params = [
        *(starting, Status.RUNNING, Status.CLAIMED),
        *(node, secrets.token_hex(16), lease_until, now),
        *(starting, now),
        [row.sequence for row, _ in chosen],
        *(now, Status.PENDING, Status.CLAIMED, event_node),
        *(now, Status.CLAIMED, Status.RUNNING, event_node, Status.RUNNING),
    ]
    taken = {row.sequence: row for row in _fetch(Execution, _take_sql(), params)}
    return [(taken[row.sequence], task) for row, task in chosen if row.sequence in taken]
