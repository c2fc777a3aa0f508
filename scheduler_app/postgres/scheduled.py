"""Scheduled occurrences in one statement on PostgreSQL: the executions and their creation events.

The ORM path compiles a multi-row INSERT with a parameter per value (about 30 per row, each
quoted by the driver in Python), then inserts the events in a second statement. Here the rows
travel as one JSON document and one statement inserts them, skips those whose occurrence id
exists (ON CONFLICT DO NOTHING, as the ORM path's fallback does row by row) and appends an event
for each row it inserted. The columns a row does not carry hold the values the ORM path would
write, taken from an unsaved Execution and written into the text once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from functools import cache
from typing import Any

from scheduler_app import journal
from scheduler_app.models import Execution, ExecutionEvent, Task
from scheduler_app.postgres import batch, binding
from scheduler_app.postgres.trigger import literal

# The columns each row carries; created_at and updated_at are the call's instant.
PER_ROW = (
    "occurrence_id",
    "task_id",
    "task_revision",
    "trigger_type",
    "trigger_source",
    "scheduled_for",
    "due_at",
    "missed_fire_times",
    "params",
    "status",
    "max_attempts",
    "finished_at",
    "error",
)
# Values that are not JSON scalars as they are: sent as JSON, cast back by their column's type.
_JSON_DUMPED = ("occurrence_id", "scheduled_for", "due_at", "finished_at")


@cache
def _statement() -> str:
    connection = binding.journal_connection()
    quote = connection.ops.quote_name
    by_name = {f.attname: f for f in Execution._meta.concrete_fields}
    typed = [(name, by_name[name].cast_db_type(connection)) for name in PER_ROW]
    template = Execution()
    fields = [f for f in Execution._meta.concrete_fields if not f.primary_key]
    values = []
    for f in fields:
        if f.attname in PER_ROW:
            values.append(f"r.{f.attname}")
        elif f.attname in ("created_at", "updated_at"):
            values.append("%(now)s")
        else:
            values.append(literal(f, getattr(template, f.attname), connection))
    columns = ", ".join(f"{name} {kind}" for name, kind in [*typed, ("reason", "text"), ("n", "integer")])
    event_columns = ", ".join(quote(name) for name in ("execution_id", *batch.EVENT_FIELDS))
    return (
        f"WITH r AS (SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb) AS r({columns})),"
        f" e AS (INSERT INTO {binding.table(Execution)} ({', '.join(quote(str(f.column)) for f in fields)})"
        f" SELECT {', '.join(values)} FROM r ORDER BY r.n"
        " ON CONFLICT DO NOTHING RETURNING sequence, occurrence_id),"
        f" v AS (INSERT INTO {binding.table(ExecutionEvent)} ({event_columns})"
        f" SELECT e.sequence, %(now)s, '', r.status, r.reason, %(node)s, 0, NULL, r.error"
        " FROM e JOIN r ON r.occurrence_id = e.occurrence_id)"
        " SELECT occurrence_id, sequence FROM e"
    )


def insert(rows: Sequence[tuple[Execution, str]], node: str, now: datetime) -> list[Execution]:
    """Insert new scheduled occurrences with their creation events; the inserted ones, with their sequence."""
    documents = []
    for n, (execution, reason) in enumerate(rows):
        document: dict[str, Any] = {name: getattr(execution, name) for name in PER_ROW}
        for name in _JSON_DUMPED:
            value = document[name]
            document[name] = (
                None if value is None else str(value) if name == "occurrence_id" else value.isoformat()
            )
        document["reason"] = reason[: journal.REASON_LENGTH]
        document["n"] = n
        documents.append(document)
    params = {
        "rows": json.dumps(documents, separators=(",", ":"), allow_nan=False),
        "now": now,
        "node": node[: journal.NODE_LENGTH],
    }
    connection = binding.journal_connection()
    with binding.bound_cursor(connection) as cursor:
        cursor.execute(_statement(), params)
        sequences = dict(cursor.fetchall())
    if sequences:
        binding.saw(max(sequences.values()))
    created = []
    for execution, _ in rows:
        sequence = sequences.get(execution.occurrence_id)
        if sequence is not None:
            execution.sequence = sequence
            execution._state.adding = False
            execution._state.db = connection.alias
            created.append(execution)
    return created


def move_next_runs(tasks: Sequence[Task]) -> None:
    """Store each task's new next_run_at, in one statement whatever the instants (the ORM path
    takes one per distinct instant, or a CASE per row)."""
    ids = [task.id for task in tasks]
    with binding.bound_cursor(binding.journal_connection()) as cursor:
        cursor.execute(move_next_runs_sql(), [ids, [task.next_run_at for task in tasks], ids])


@cache
def move_next_runs_sql() -> str:
    return (
        f"UPDATE {binding.table(Task)} t SET next_run_at = u.next"
        " FROM unnest(%s::text[], %s::timestamptz[]) AS u(id, next)"
        # The ids again, as an array the task's key is looked up with: joined with the unnested
        # rows alone, PostgreSQL read the whole task table at each batch of 200 (a hash join).
        " WHERE t.id = ANY(%s::text[]) AND t.id = u.id"
    )
