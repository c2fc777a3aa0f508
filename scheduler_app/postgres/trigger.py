"""Manual triggers in one statement on PostgreSQL: read the task, insert the executions and their events.

The ORM path takes five round trips (task read, BEGIN, two INSERTs, COMMIT);
this one statement in autocommit is atomic on its own and takes one. It
inserts nothing when the task does not exist or the occurrence id or key is
taken; the caller then takes the ORM path, which tells those cases apart.
The values are those the ORM path would write: the task's four columns from
the task row, the caller's from the unsaved Execution, the rest the defaults
of a manual trigger, and the event's those of journal.event; the constants
are written into the text once, so a call binds eight values.
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from datetime import datetime
from functools import cache
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Field

from scheduler_app import journal
from scheduler_app.models import Execution, ExecutionEvent, Status, Task, TriggerType
from scheduler_app.postgres import binding
from scheduler_app.postgres.notify import CHANNEL

FROM_TASK = {
    "task_revision": "t.revision",
    "params": "t.params || %(params)s",  # shallow merge, as {**task.params, **params}
    "max_attempts": "t.retry_max_attempts",
}
RETURNED = ("sequence", "task_revision", "params", "max_attempts")


# The execution columns a trigger sets, by parameter; every other column holds its default,
# written into the statement's text (as are the creation event's constants). One instant is
# the creation, update and event time, another the due time (later for run_at or delay), so a
# call binds nine values in all.
FROM_CALLER = {
    "occurrence_id": "occurrence_id",
    "task_id": "task_id",
    "trigger_source": "trigger_source",
    "idempotency_key": "idempotency_key",
    "payload_hash": "payload_hash",
    "due_at": "due_at",
    "created_at": "now",
    "updated_at": "now",
}
EVENT_FROM_CALLER = {"at": "now", "reason": "reason"}


def literal(field: Field[Any, Any], value: Any, connection: Any) -> str:
    """A constant of ours as SQL text, cast to its column's type."""
    if value is None:
        text = "NULL"
    elif isinstance(value, bool):
        text = "TRUE" if value else "FALSE"
    elif isinstance(value, int):
        text = str(value)
    elif isinstance(value, str):
        text = "'" + value.replace("'", "''") + "'"
    else:
        raise TypeError(f"no literal for {type(value).__name__}")
    return f"{text}::{field.cast_db_type(connection)}"


def _inserts(per_row: dict[str, str], rows: str, returned: str, conflict: str) -> str:
    """The statement's common part: the task row ``t``, then ``e``, the executions inserted from
    ``rows`` (``per_row`` maps columns to the SQL of their value in each row, instead of a
    parameter), and ``v``, their creation events."""
    connection = binding.journal_connection()
    quote = connection.ops.quote_name
    template = Execution(trigger_type=TriggerType.MANUAL)
    fields = [f for f in Execution._meta.concrete_fields if not f.primary_key]
    values = []
    for f in fields:
        if f.attname in per_row:
            values.append(per_row[f.attname])
        elif f.attname in FROM_TASK:
            values.append(FROM_TASK[f.attname])
        elif f.attname in FROM_CALLER:
            values.append(f"%({FROM_CALLER[f.attname]})s")
        else:
            values.append(literal(f, getattr(template, f.attname), connection))
    event = journal.event(0, datetime.now(), "", Status.PENDING, "")
    event_fields = [f for f in ExecutionEvent._meta.concrete_fields if not f.primary_key]
    assert event_fields[0].attname == "execution_id"
    event_values = [
        f"%({EVENT_FROM_CALLER[f.attname]})s"
        if f.attname in EVENT_FROM_CALLER
        else literal(f, getattr(event, f.attname), connection)
        for f in event_fields[1:]
    ]
    return (
        f"t AS (SELECT revision, params, retry_max_attempts FROM {binding.table(Task)}"
        " WHERE id = %(task_id)s),"
        f" e AS (INSERT INTO {binding.table(Execution)}"
        f" ({', '.join(quote(str(f.column)) for f in fields)})"
        f" SELECT {', '.join(values)} FROM {rows}"
        f"{conflict} RETURNING {returned}),"
        f" v AS (INSERT INTO {binding.table(ExecutionEvent)}"
        f" ({', '.join(quote(str(f.column)) for f in event_fields)})"
        f" SELECT e.sequence, {', '.join(event_values)} FROM e)"
    )


@cache
def _statement(wake: bool) -> str:
    inserts = _inserts({}, "t", ", ".join(RETURNED), " ON CONFLICT DO NOTHING")
    # The runners' wake-up, for the row inserted: PostgreSQL delivers it when the trigger commits.
    notify = f", pg_notify('{CHANNEL}', '')" if wake else ""
    return f"WITH {inserts} SELECT {', '.join(RETURNED)}{notify} FROM e"


# Per row of a batch: its occurrence id, key, payload hash and params, from unnest()ed arrays.
FROM_BATCH_ROW = {
    "occurrence_id": "i.occurrence_id",
    "idempotency_key": "i.idempotency_key",
    "payload_hash": "i.payload_hash",
    "params": "t.params || i.params",
}


@cache
def _many_statement() -> str:
    """Insert a batch unless one of its keys was used with other params (nothing is inserted then).

    Rows whose key was used before with the same params are left out; keys a concurrent trigger
    takes meanwhile make the statement fail whole (no ON CONFLICT): nothing is written, and the
    caller takes the ORM path. Answers the inserted rows, whole, then the occurrence ids of those left
    out, each with whether its key was used with other params (the last column; NULL for inserted rows).
    """
    columns = ", ".join(f"e.{f.column}" for f in Execution._meta.concrete_fields)
    rows = (
        "unnest(%(occurrence_ids)s::uuid[], %(keys)s::varchar[], %(hashes)s::varchar[], %(params)s::jsonb[])"
        " WITH ORDINALITY AS i (occurrence_id, idempotency_key, payload_hash, params, n) CROSS JOIN t"
        " WHERE i.occurrence_id NOT IN (SELECT occurrence_id FROM x)"
        " AND NOT EXISTS (SELECT 1 FROM x WHERE x.conflicting) ORDER BY i.n"
    )
    inserts = _inserts(FROM_BATCH_ROW, rows, "*", "")
    return (
        f"WITH x AS (SELECT o.occurrence_id, o.payload_hash <> i.payload_hash AS conflicting"
        f" FROM {binding.table(Execution)} o JOIN unnest(%(occurrence_ids)s::uuid[], %(hashes)s::varchar[])"
        " AS i (occurrence_id, payload_hash) ON o.occurrence_id = i.occurrence_id"
        " WHERE o.occurrence_id = ANY(%(keyed)s::uuid[])),"
        f" {inserts}"
        f" SELECT {columns}, NULL FROM e"
        f" UNION ALL SELECT {', '.join(_only_occurrence_id())}, x.conflicting FROM x"
    )


def _only_occurrence_id() -> list[str]:
    return [
        "x.occurrence_id" if f.attname == "occurrence_id" else "NULL" for f in Execution._meta.concrete_fields
    ]


def insert_manual(
    execution: Execution, caller_params: dict[str, Any], reason: str, now: datetime, wake: bool
) -> bool:
    """Insert ``execution`` (its task columns filled from the task row) and its creation event, and
    with ``wake`` send the runners' wake-up (``postgres/notify.py``) when it commits.

    ``execution`` is a new manual trigger: only its FROM_CALLER columns differ from the
    defaults, and it is created and updated at ``now``. True and ``execution`` completed
    when inserted; False when nothing was written.
    """
    connection = binding.journal_connection()
    values = {name: getattr(execution, attname) for attname, name in FROM_CALLER.items() if name != "now"}
    values["now"] = now
    values["params"] = Execution._meta.get_field("params").get_db_prep_save(caller_params, connection)
    values["reason"] = reason[: journal.REASON_LENGTH]
    with binding.bound_cursor(connection) as cursor:
        cursor.execute(_statement(wake), values)
        row = cursor.fetchone()
    if row is None:
        return False
    execution.sequence, execution.task_revision, params, execution.max_attempts = row[: len(RETURNED)]
    # Django has psycopg hand jsonb over as text, for the field to decode.
    execution.params = json.loads(params) if isinstance(params, str) else params
    execution._state.adding = False
    execution._state.db = connection.alias
    return True


def insert_manual_many(
    task_id: str, source: str, planned: list[Execution], keyed: list[Any], reason: str, now: datetime
) -> tuple[list[Execution], list[Any]] | None:
    """Insert the ``planned`` executions of one task (distinct occurrence ids) and their events, in one
    statement; ``keyed``: the occurrence ids that carry an idempotency key.

    Answers the inserted executions, in order, and the occurrence ids of those left out because their
    key was used before with the same params; None when nothing was written: the task is missing, a
    key was used with other params, or a concurrent trigger took one, for the ORM path to tell apart.
    """
    connection = binding.journal_connection()
    params_field = Execution._meta.get_field("params")
    values = {
        "task_id": task_id,
        "trigger_source": source,
        "now": now,
        "due_at": now,
        "reason": reason[: journal.REASON_LENGTH],
        "occurrence_ids": [e.occurrence_id for e in planned],
        "keys": [e.idempotency_key for e in planned],
        "hashes": [e.payload_hash for e in planned],
        "params": [params_field.get_db_prep_save(e.params, connection) for e in planned],
        "keyed": keyed,
    }
    # In the caller's transaction, a savepoint keeps a failed statement from aborting it.
    savepoint = transaction.atomic(using=connection.alias) if connection.in_atomic_block else nullcontext()
    try:
        with savepoint, binding.bound_cursor(connection) as cursor:
            cursor.execute(_many_statement(), values)
            rows = cursor.fetchall()
    except IntegrityError:
        return None
    fields = Execution._meta.concrete_fields
    names = [f.attname for f in fields]
    # Django has psycopg hand jsonb over as text, for the fields to decode.
    decoders = [(n, f.from_db_value) for n, f in enumerate(fields) if hasattr(f, "from_db_value")]
    inserted = []
    for row in rows:
        if row[-1] is None:
            values_of_row = list(row[:-1])
            for n, decode in decoders:
                values_of_row[n] = decode(values_of_row[n], None, connection)
            inserted.append(Execution.from_db(connection.alias, names, values_of_row))
    existing = [row[names.index("occurrence_id")] for row in rows if row[-1] is False]
    if any(row[-1] for row in rows) or len(inserted) + len(existing) != len(planned):
        return None
    return inserted, existing
