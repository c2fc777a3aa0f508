"""A manual trigger in one statement on PostgreSQL: read the task, insert the execution and its event.

The ORM path takes five round trips (task read, BEGIN, two INSERTs, COMMIT);
this one statement in autocommit is atomic on its own and takes one. It
inserts nothing when the task does not exist or the occurrence id or key is
taken; the caller then takes the ORM path, which tells those cases apart.
The values are those the ORM path would write: every execution column comes
from an unsaved Execution, except the four read from the task row, and the
event's are journal.event's (the fields' defaults where it sets nothing).
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cache
from typing import Any

from django.db import connections, router
from django.db.models import Field

from scheduler_app import db, journal
from scheduler_app.models import Execution, ExecutionEvent, Status, Task

FROM_TASK = {
    "task_revision": "t.revision",
    "params": "t.params || %s",  # shallow merge, as {**task.params, **params}
    "max_attempts": "t.retry_max_attempts",
}
RETURNED = ("sequence", "task_revision", "params", "max_attempts")


@cache
def _statement() -> tuple[str, list[Field[Any, Any]], list[Field[Any, Any]]]:
    """The statement, the execution fields it takes from the caller and the event fields after the first."""
    quote = connections[router.db_for_write(Execution)].ops.quote_name
    fields = [f for f in Execution._meta.concrete_fields if not f.primary_key]
    event_fields = [f for f in ExecutionEvent._meta.concrete_fields if not f.primary_key]
    assert event_fields[0].attname == "execution_id"
    sql = (
        f"WITH t AS (SELECT revision, params, retry_max_attempts FROM {quote(Task._meta.db_table)} WHERE id = %s),"
        f" e AS (INSERT INTO {quote(Execution._meta.db_table)}"
        f" ({', '.join(quote(str(f.column)) for f in fields)})"
        f" SELECT {', '.join(FROM_TASK.get(f.attname, '%s') for f in fields)} FROM t"
        f" ON CONFLICT DO NOTHING RETURNING {', '.join(RETURNED)}),"
        f" v AS (INSERT INTO {quote(ExecutionEvent._meta.db_table)}"
        f" ({', '.join(quote(str(f.column)) for f in event_fields)})"
        f" SELECT e.sequence, {', '.join(['%s'] * (len(event_fields) - 1))} FROM e)"
        f" SELECT {', '.join(RETURNED)} FROM e"
    )
    return sql, [f for f in fields if f.attname not in FROM_TASK or f.attname == "params"], event_fields[1:]


def insert_manual(execution: Execution, caller_params: dict[str, Any], reason: str, now: datetime) -> bool:
    """Insert ``execution`` (its task columns filled from the task row) and its creation event.

    True and ``execution`` completed when inserted; False when nothing was written.
    """
    connection = connections[router.db_for_write(Execution)]
    sql, fields, event_fields = _statement()
    event = {
        "at": now,
        "from_status": "",
        "to_status": Status.PENDING,
        "reason": reason[: journal.REASON_LENGTH],
    }
    values: list[Any] = [execution.task_id]
    for f in fields:
        value = caller_params if f.attname == "params" else getattr(execution, f.attname)
        values.append(db.bind(f, value, connection))
    values += [
        db.bind(f, event[f.attname] if f.attname in event else f.get_default(), connection)
        for f in event_fields
    ]
    with db.bound_cursor(connection) as cursor:
        cursor.execute(sql, values)
        row = cursor.fetchone()
    if row is None:
        return False
    execution.sequence, execution.task_revision, params, execution.max_attempts = row
    # Django has psycopg hand jsonb over as text, for the field to decode.
    execution.params = json.loads(params) if isinstance(params, str) else params
    execution._state.adding = False
    execution._state.db = connection.alias
    return True
