"""The cursor PostgreSQL's fixed statements run on, and the helpers that write their text."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connections, router

from scheduler_app.models import Execution


def journal_connection() -> Any:
    """The connection the journal is written on: the router's choice for Execution."""
    return connections[router.db_for_write(Execution)]


def table(model: Any) -> str:
    """``model``'s table, quoted for the journal's connection (fixed statements of its own database)."""
    return str(journal_connection().ops.quote_name(model._meta.db_table))


@contextmanager
def bound_cursor(connection: Any) -> Iterator[Any]:
    """A PostgreSQL cursor that sends parameters apart from the statement (server-side binding).

    Django's cursors splice parameters into the text; for the hot fixed statements of
    ``postgres.batch`` and ``postgres.trigger`` that costs more Python than the round trip, and keeps
    PostgreSQL from reusing a plan where the connection prepares statements (its
    ``prepare_threshold`` option). Django's error translation and execute wrappers still apply.
    """
    import psycopg

    connection.ensure_connection()
    with connection.wrap_database_errors:
        raw = psycopg.Cursor(connection.connection)
    cursor = connection.make_debug_cursor(raw) if connection.queries_logged else connection.make_cursor(raw)
    with cursor:
        yield cursor


def status_literal(*statuses: str) -> str:
    """Statuses as SQL text, one literal or a parenthesised list.

    For the fixed statements' conditions on status: the values are constants of the
    code, and written into the text they let a prepared statement's generic plan know
    how few rows match, where parameters would hide it (and keep PostgreSQL planning
    every call).
    """
    assert statuses and all(status.isalpha() for status in statuses)
    if len(statuses) == 1:
        return f"'{statuses[0]}'"
    return "(" + ", ".join(f"'{status}'" for status in statuses) + ")"
