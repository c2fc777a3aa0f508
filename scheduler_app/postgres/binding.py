"""The cursor PostgreSQL's fixed statements run on, and the helpers that write their text."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from functools import cache
from typing import Any

from django.db import connections, router

from scheduler_app.models import Execution

NEVER_BY_COUNT = 2**31 - 1
# Set on a psycopg connection whose session plans its prepared statements at each call.
PLANNED_AT_EACH_CALL = "_scheduler_planned_at_each_call"

# Whether this thread is a runner's loop or journal writer (planned_at_each_call).
_runner_thread = threading.local()


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
def planned_at_each_call() -> Iterator[None]:
    """Within, the prepared statements of this thread's journal connection are planned at every
    call (``plan_cache_mode = force_custom_plan`` on its session), for the tables as they are then.

    PostgreSQL otherwise settles on a generic plan after a prepared statement's fifth call and keeps
    it until the next ANALYZE of its tables. A runner's first calls meet an empty or small journal,
    where reading a whole table is the cheapest plan; a burst of 10,000 executions a minute later
    then read the whole table at every batch of outcomes (4.5 ms a call instead of 0.8 ms). Only the
    runner's own threads do this: a web process's connection, and the workers that run handlers,
    keep the session as the project set it.
    """
    _runner_thread.active = True
    try:
        yield
    finally:
        _runner_thread.active = False
        raw = journal_connection().connection
        if raw is not None and getattr(raw, PLANNED_AT_EACH_CALL, False):
            setattr(raw, PLANNED_AT_EACH_CALL, False)
            with suppress(Exception), raw.cursor() as cursor:  # a broken connection is closed anyway
                cursor.execute("RESET plan_cache_mode")


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
        if getattr(_runner_thread, "active", False) and not getattr(
            connection.connection, PLANNED_AT_EACH_CALL, False
        ):
            with connection.wrap_database_errors, connection.connection.cursor() as cursor:
                cursor.execute("SET plan_cache_mode = force_custom_plan")
            setattr(connection.connection, PLANNED_AT_EACH_CALL, True)
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
