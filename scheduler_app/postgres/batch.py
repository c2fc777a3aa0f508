"""The journal writer's batches on PostgreSQL: all starts, or all outcomes, of a batch in one statement.

The ORM path (``statements.orm.Statements``) takes a transaction of six round trips
or more (BEGIN, the fenced lock, an UPDATE per kind of move, the events, the
log rows, COMMIT). Here one statement, atomic on its own in autocommit, locks
the rows in sequence order (as ``journal.lock_rows`` does), keeps those still
owned (token and status; for a start, no stop requested), moves them, appends
their events and, where the log row shares the outcome's commit, upserts it.
The rows travel as arrays (starts) or as a JSON document (outcomes), so the
statement's text does not depend on the batch and PostgreSQL can keep its
plan where the connection prepares statements. The values are those the ORM path writes: they come
from the same ``Finish`` plans, cut to the lengths ``journal.event`` cuts to.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING, Any

from django.db.models import Field, Model

from scheduler_app import journal
from scheduler_app.logs import LOG_FIELDS
from scheduler_app.models import Execution, ExecutionEvent, ExecutionLog, Status
from scheduler_app.postgres import binding
from scheduler_app.sql import status_literal

if TYPE_CHECKING:
    from scheduler_app.runner.claims import Claim
    from scheduler_app.runner.recording import Finish

# Every column a Finish may set; a row leaves the ones its plan does not name as they are.
FINISH_COLUMNS = (
    "status",
    "updated_at",
    "log_persistence",
    "due_at",
    "owner",
    "execution_token",
    "lease_expires_at",
    "finished_at",
    "result",
    "error",
)
EVENT_FIELDS = ("at", "from_status", "to_status", "reason", "node", "attempt", "result", "error")


def _field(model: type[Model], name: str) -> Field[Any, Any]:
    field = model._meta.get_field(name)
    assert isinstance(field, Field)
    return field


def _unnest(alias: str, columns: Sequence[tuple[str, str]]) -> str:
    """``unnest(%s::type[], ...) AS alias(name, ...)``: one array parameter per (name, type)."""
    arrays = ", ".join(f"%s::{kind}[]" for _, kind in columns)
    return f"unnest({arrays}) AS {alias}({', '.join(name for name, _ in columns)})"


def _typed(model: type[Model], names: Sequence[str], prefix: str = "") -> list[tuple[str, str]]:
    connection = binding.journal_connection()
    return [(prefix + name, _field(model, name).cast_db_type(connection) or "text") for name in names]


def _tables() -> tuple[str, str, str]:
    return binding.table(Execution), binding.table(ExecutionEvent), binding.table(ExecutionLog)


def _owned_rows(status_test: str) -> str:
    """The CTE ``l``: the rows of ``v`` still owned, locked in the order of ``v`` (by sequence).

    The SQL twin of ``journal.owned`` (the token, and a status test).

    One primary-key lookup per row, whatever the planner believes of the table's size;
    ``l`` carries ``v``'s columns, so later steps join nothing else.
    """
    execution, _, _ = _tables()
    return (
        "l AS (SELECT v.* FROM v CROSS JOIN LATERAL"
        f" (SELECT 1 FROM {execution} e WHERE e.sequence = v.sequence"
        f" AND e.execution_token = v.token AND {status_test} FOR UPDATE OF e) x)"
    )


def _event_insert(source: str) -> str:
    _, event, _ = _tables()
    columns = ", ".join(["execution_id", *EVENT_FIELDS])
    return f"i AS (INSERT INTO {event} ({columns}) {source})"


@cache
def _start_sql() -> str:
    execution, _, _ = _tables()
    batch = _unnest("v", [("sequence", "bigint"), ("token", "text")])
    return (
        f"WITH v AS (SELECT * FROM {batch}),"
        # The status as a parameter, not a literal: a literal matches the partial index of leased
        # rows, which a plan made on a small journal then reads whole for each row of the batch.
        f" {_owned_rows('e.status = %s AND NOT e.stop_requested')},"
        # The array of sequences, as in the outcomes' statement: a plan made on a small journal
        # joined ``l`` with a read of the whole table.
        f" u AS (UPDATE {execution} e SET status = %s, started_at = %s, updated_at = %s"
        " FROM l WHERE e.sequence = ANY(%s::bigint[]) AND e.sequence = l.sequence"
        " RETURNING e.sequence, e.attempt),"
        f" {_event_insert('SELECT u.sequence, %s, %s, %s, %s, %s, u.attempt, NULL, NULL FROM u')}"
        " SELECT sequence FROM u"
    )


def start(claimed: Sequence[Claim], node: str, now: datetime) -> set[int]:
    """claimed -> running for every claim still owned and not asked to stop; the sequences moved."""
    if not claimed:
        return set()
    claims = sorted(claimed, key=lambda c: c.execution.sequence)
    sequences = [c.execution.sequence for c in claims]
    params = [
        sequences,
        [c.token for c in claims],
        Status.CLAIMED,
        Status.RUNNING,
        now,
        now,
        sequences,
        now,
        Status.CLAIMED,
        Status.RUNNING,
        "started",
        node[: journal.NODE_LENGTH],
    ]
    return set(_run(_start_sql(), params, sequences[-1]))


def _records(alias: str, columns: Sequence[tuple[str, str]]) -> str:
    """``jsonb_to_recordset(%s::jsonb) AS alias(name type, ...)``: rows sent as one JSON array."""
    return (
        f"jsonb_to_recordset(%s::jsonb) AS {alias}({', '.join(f'{name} {kind}' for name, kind in columns)})"
    )


@cache
def _finish_sql() -> str:
    execution, _, log = _tables()
    batch = _records(
        "v",
        [
            ("sequence", "bigint"),
            ("token", "text"),
            ("from_status", "text"),
            ("given", "text[]"),
            *_typed(Execution, FINISH_COLUMNS, "new_"),
            *_typed(ExecutionEvent, ("reason", "result", "error"), "event_"),
        ],
    )
    assignments = ", ".join(
        f"{name} = CASE WHEN '{name}' = ANY(l.given) THEN l.new_{name} ELSE e.{name} END"
        for name in FINISH_COLUMNS
    )
    log_columns = ["id", *LOG_FIELDS]
    logs = _records("g", [("sequence", "bigint"), *_typed(ExecutionLog, log_columns)])
    upsert = ", ".join(f"{name} = EXCLUDED.{name}" for name in LOG_FIELDS)
    events_from_u = "SELECT sequence, %s, from_status, new_status, event_reason, %s, attempt, event_result, event_error FROM u"
    return (
        f"WITH v AS (SELECT * FROM {batch}),"
        # An outcome that registers a result is refused once a stop was requested (recording.py).
        f" {_owned_rows(f'e.status = v.from_status AND (NOT e.stop_requested OR v.new_status IN {status_literal(Status.INTERRUPTED, Status.UNKNOWN)})')},"
        # The array of sequences lets the planner see a handful of primary-key lookups, where
        # it takes a JSON document for a hundred rows (and would scan the table).
        f" u AS (UPDATE {execution} e SET {assignments} FROM l"
        " WHERE e.sequence = ANY(%s::bigint[]) AND e.sequence = l.sequence"
        " RETURNING e.sequence, e.attempt, l.from_status, l.new_status, l.event_reason, l.event_result,"
        " l.event_error),"
        f" {_event_insert(events_from_u)},"
        f" g AS (INSERT INTO {log} ({', '.join(log_columns)})"
        f" SELECT {', '.join(log_columns)} FROM {logs} WHERE g.sequence IN (SELECT sequence FROM u)"
        f" ON CONFLICT (id) DO UPDATE SET {upsert})"
        " SELECT sequence FROM u"
    )


def finish(finishes: Sequence[Finish], node: str, now: datetime) -> set[int]:
    """Record every planned outcome whose row is still owned; the sequences recorded.

    The rows go as JSON documents (one for the outcomes, one for the log rows): two
    parameters whatever the batch, where one array per column cost more Python to send
    than the statement costs the database. JSON null arrives as SQL NULL, as the ORM writes None.
    """
    if not finishes:
        return set()
    rows, log_rows = [], []
    for f in sorted(finishes, key=lambda f: f.attempt.claim.execution.sequence):
        sequence = f.attempt.claim.execution.sequence
        values = f.columns()
        rows.append(
            {
                "sequence": sequence,
                "token": f.attempt.claim.token,
                "from_status": f.from_status,
                "given": list(values),
                **{f"new_{name}": value for name, value in values.items()},
                "event_reason": f.reason[: journal.REASON_LENGTH],
                "event_result": f.outcome.result,
                "event_error": f.outcome.error,
            }
        )
        if f.log_with_outcome:
            log_rows.append(
                {"sequence": sequence, **{name: getattr(f.log, name) for name in ["id", *LOG_FIELDS]}}
            )
    params = [
        _json(rows),
        [row["sequence"] for row in rows],
        now,
        node[: journal.NODE_LENGTH],
        _json(log_rows),
    ]
    return set(_run(_finish_sql(), params, rows[-1]["sequence"]))


def _json(rows: list[dict[str, Any]]) -> str:
    return json.dumps(rows, default=_json_default, separators=(",", ":"), allow_nan=False)


def _json_default(value: Any) -> str:
    if isinstance(value, (datetime, uuid.UUID)):
        return value.isoformat() if isinstance(value, datetime) else str(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def _run(sql: str, params: list[Any], newest: int) -> list[int]:
    """``sql`` run; ``newest``: the highest sequence of its rows, noted before it is planned."""
    binding.saw(newest)
    with binding.bound_cursor(binding.journal_connection()) as cursor:
        cursor.execute(sql, params)
        return [sequence for (sequence,) in cursor.fetchall()]
