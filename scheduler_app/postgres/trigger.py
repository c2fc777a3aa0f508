"""A manual trigger in one statement on PostgreSQL: read the task, insert the execution and its event.

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
from datetime import datetime
from functools import cache
from typing import Any

from django.db.models import Field

from scheduler_app import journal
from scheduler_app.models import Execution, ExecutionEvent, Status, Task, TriggerType
from scheduler_app.postgres import binding

FROM_TASK = {
    "task_revision": "t.revision",
    "params": "t.params || %(params)s",  # shallow merge, as {**task.params, **params}
    "max_attempts": "t.retry_max_attempts",
}
RETURNED = ("sequence", "task_revision", "params", "max_attempts")


# The execution columns a trigger sets, by parameter; every other column holds its default,
# written into the statement's text (as are the creation event's constants). One instant is
# the due, creation, update and event time, so a call binds eight values in all.
FROM_CALLER = {
    "occurrence_id": "occurrence_id",
    "task_id": "task_id",
    "trigger_source": "trigger_source",
    "idempotency_key": "idempotency_key",
    "payload_hash": "payload_hash",
    "due_at": "now",
    "created_at": "now",
    "updated_at": "now",
}
EVENT_FROM_CALLER = {"at": "now", "reason": "reason"}


def _literal(field: Field[Any, Any], value: Any, connection: Any) -> str:
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


@cache
def _statement() -> str:
    connection = binding.journal_connection()
    quote = connection.ops.quote_name
    template = Execution(trigger_type=TriggerType.MANUAL)
    fields = [f for f in Execution._meta.concrete_fields if not f.primary_key]
    values = []
    for f in fields:
        if f.attname in FROM_TASK:
            values.append(FROM_TASK[f.attname])
        elif f.attname in FROM_CALLER:
            values.append(f"%({FROM_CALLER[f.attname]})s")
        else:
            values.append(_literal(f, getattr(template, f.attname), connection))
    event = journal.event(0, datetime.now(), "", Status.PENDING, "")
    event_fields = [f for f in ExecutionEvent._meta.concrete_fields if not f.primary_key]
    assert event_fields[0].attname == "execution_id"
    event_values = [
        f"%({EVENT_FROM_CALLER[f.attname]})s"
        if f.attname in EVENT_FROM_CALLER
        else _literal(f, getattr(event, f.attname), connection)
        for f in event_fields[1:]
    ]
    return (
        f"WITH t AS (SELECT revision, params, retry_max_attempts FROM {binding.table(Task)}"
        " WHERE id = %(task_id)s),"
        f" e AS (INSERT INTO {binding.table(Execution)}"
        f" ({', '.join(quote(str(f.column)) for f in fields)})"
        f" SELECT {', '.join(values)} FROM t"
        f" ON CONFLICT DO NOTHING RETURNING {', '.join(RETURNED)}),"
        f" v AS (INSERT INTO {binding.table(ExecutionEvent)}"
        f" ({', '.join(quote(str(f.column)) for f in event_fields)})"
        f" SELECT e.sequence, {', '.join(event_values)} FROM e)"
        f" SELECT {', '.join(RETURNED)} FROM e"
    )


def insert_manual(execution: Execution, caller_params: dict[str, Any], reason: str, now: datetime) -> bool:
    """Insert ``execution`` (its task columns filled from the task row) and its creation event.

    ``execution`` is a new manual trigger: only its FROM_CALLER columns differ from the
    defaults, and it is due, created and updated at ``now``. True and ``execution`` completed
    when inserted; False when nothing was written.
    """
    connection = binding.journal_connection()
    values = {name: getattr(execution, attname) for attname, name in FROM_CALLER.items() if name != "now"}
    values["now"] = now
    values["params"] = Execution._meta.get_field("params").get_db_prep_save(caller_params, connection)
    values["reason"] = reason[: journal.REASON_LENGTH]
    with binding.bound_cursor(connection) as cursor:
        cursor.execute(_statement(), values)
        row = cursor.fetchone()
    if row is None:
        return False
    execution.sequence, execution.task_revision, params, execution.max_attempts = row
    # Django has psycopg hand jsonb over as text, for the field to decode.
    execution.params = json.loads(params) if isinstance(params, str) else params
    execution._state.adding = False
    execution._state.db = connection.alias
    return True
