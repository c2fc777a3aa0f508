"""The cursor PostgreSQL's fixed statements run on, and the helpers that write their text."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

from django.db import connections, router

from scheduler_app.models import Execution

NEVER_BY_COUNT = 2**31 - 1


def journal_connection() -> Any:
    """The connection the journal is written on: the router's choice for Execution."""
    return connections[router.db_for_write(Execution)]


def table(model: Any) -> str:
    """``model``'s table, quoted for the journal's connection (fixed statements of its own database)."""
    return str(journal_connection().ops.quote_name(model._meta.db_table))


def prepares(connection: Any) -> bool:
    """Whether the fixed statements are prepared on ``connection``: PREPARED_STATEMENTS, and when it
    is None (the default), unless the database is reached through a transaction-mode pooler, which
    Django's ``DISABLE_SERVER_SIDE_CURSORS`` says (a statement prepared on one server connection
    would be run on another)."""
    from scheduler_app.conf import scheduler_settings

    chosen = scheduler_settings.PREPARED_STATEMENTS
    if chosen is not None:
        return bool(chosen)
    return not connection.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS", False)


@contextmanager
def bound_cursor(connection: Any) -> Iterator[Any]:
    """A PostgreSQL cursor that sends parameters apart from the statement (server-side binding),
    and prepares it where ``prepares`` allows, so that PostgreSQL plans each fixed statement once
    per connection instead of at every call.

    Django's cursors splice parameters into the text; for the hot fixed statements of
    ``postgres.batch``, ``postgres.claims`` and ``postgres.trigger`` that costs more Python than the
    round trip, and planning them costs the database more than running them. Django's error
    translation and execute wrappers still apply; its own queries are never prepared.
    """
    import psycopg

    connection.ensure_connection()
    cursor_class = psycopg.Cursor
    if prepares(connection):
        cursor_class = _preparing_cursor()
        if connection.connection.prepare_threshold is None:
            # psycopg prepares nothing while the threshold is None (Django's default); a threshold
            # no statement reaches lets only these cursors' statements be prepared.
            connection.connection.prepare_threshold = NEVER_BY_COUNT
    with connection.wrap_database_errors:
        raw = cursor_class(connection.connection)
    cursor = connection.make_debug_cursor(raw) if connection.queries_logged else connection.make_cursor(raw)
    with cursor:
        yield cursor


@cache
def _preparing_cursor() -> Any:
    import psycopg

    class PreparingCursor(psycopg.Cursor):
        """Prepares every statement it runs (psycopg keeps the last 100 per connection)."""

        def execute(
            self, query: Any, params: Any = None, *, prepare: bool | None = None, **options: Any
        ) -> Any:
            return super().execute(query, params, prepare=True if prepare is None else prepare, **options)

    return PreparingCursor
