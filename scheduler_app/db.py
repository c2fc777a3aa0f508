"""Database plumbing for the runner: the one-query probe and connection care."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import connections
from django.utils.dateparse import parse_datetime

from scheduler_app.models import LEASED, Execution, Status, Task
from scheduler_app.sql import status_literal
from scheduler_app.statements import journal_statements


@dataclass(frozen=True)
class Probe:
    """What one idle tick learns: the database clock and the earliest instants of interest."""

    now: datetime
    next_run_at: datetime | None
    next_due_at: datetime | None
    next_lease_expiry: datetime | None
    # The earliest end of a pause: a runner enables the task again then.
    next_resume_at: datetime | None


def as_utc(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        parsed = parse_datetime(value)
        if parsed is None:
            raise ValueError("unparseable datetime from the database")
        value = parsed
    if not isinstance(value, datetime):
        raise ValueError("not a datetime")
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def probe(using: str = "default") -> Probe:
    """One indexed query: database now, earliest next_run_at, due_at, lease expiry and end of a pause."""
    connection = connections[using]
    sql, params = probe_statement(connection)
    # On PostgreSQL the one statement an idle runner sends keeps its plan where statements are prepared.
    with journal_statements(connection).cursor(connection) as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    now = as_utc(row[0])
    assert now is not None
    leases = [lease for lease in (as_utc(row[3]), as_utc(row[4])) if lease is not None]
    return Probe(now, as_utc(row[1]), as_utc(row[2]), min(leases, default=None), as_utc(row[5]))


def probe_statement(connection: Any) -> tuple[str, list[Any]]:
    """The probe's SQL (with %s placeholders) and its parameters, on ``connection``."""
    task_table = connection.ops.quote_name(Task._meta.db_table)
    execution_table = connection.ops.quote_name(Execution._meta.db_table)
    sql = (
        f"SELECT {journal_statements(connection).clock_sql(connection)},"
        f" (SELECT MIN(next_run_at) FROM {task_table} WHERE enabled = %s),"
        f" (SELECT MIN(due_at) FROM {execution_table} WHERE status = {status_literal(Status.PENDING)}),"
        # One MIN per leased status: each reads one end of an index, whatever the statistics say.
        + ",".join(
            f" (SELECT MIN(lease_expires_at) FROM {execution_table} WHERE status = {status_literal(status)})"
            for status in LEASED
        )
        # A literal, as the partial index's condition: a prepared statement's plan reads it.
        + f", (SELECT MIN(disabled_until) FROM {task_table} WHERE enabled = FALSE)"
    )
    return sql, [True]


class StatementCounter:
    """Counts the statements this thread sends through Django while it is active."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.count += 1
        return execute(sql, params, many, context)


@contextmanager
def counting_statements(aliases: Iterable[str]) -> Iterator[StatementCounter]:
    counter = StatementCounter()
    with ExitStack() as stack:
        for alias in set(aliases):
            stack.enter_context(connections[alias].execute_wrapper(counter))
        yield counter


def drop_broken_connections() -> None:
    """Close connections that are broken or past CONN_MAX_AGE; keep healthy ones across ticks."""
    for connection in connections.all(initialized_only=True):
        if connection.connection is None or connection.in_atomic_block:
            continue
        max_age = connection.settings_dict.get("CONN_MAX_AGE") or 0
        expired = (
            bool(max_age) and connection.close_at is not None and time.monotonic() >= connection.close_at
        )
        if expired or (connection.errors_occurred and not connection.is_usable()):
            connection.close()
        else:
            connection.errors_occurred = False
