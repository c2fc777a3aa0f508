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
# The session settings a runner's thread plans its prepared statements under, once set on its
# psycopg connection (an attribute of that connection).
SESSION_PLANS = "_scheduler_session_plans"
AT_EACH_CALL = ("SET plan_cache_mode = force_custom_plan",)
# Only plans that read rows by key: the writer's statements name every row they touch by its key.
ONCE_BY_KEY = ("SET plan_cache_mode = force_generic_plan", "SET enable_seqscan = off")
# The newest journal row (its sequence) a connection's kept plans were made for.
PLANNED_FOR = "_scheduler_planned_for"
# Kept plans are made again once the journal's newest rows have twice the sequence they had
# then, and never for fewer new rows than this.
REPLAN_AFTER_ROWS = 1000

# The settings chosen for this thread: a runner's loop, or its journal writer.
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
    runner's loop does this (its writer: ``planned_once_by_key``): a web process's connection, and
    the workers that run handlers, keep the session as the project set it.
    """
    with _session_plans(AT_EACH_CALL):
        yield


@contextmanager
def planned_once_by_key() -> Iterator[None]:
    """Within, each prepared statement of this thread's journal connection keeps the plan made at
    its first call (``force_generic_plan``), planned without sequential scans, until the journal
    has grown enough to plan it again (``_replan_as_it_grows``).

    For the journal writer: its two statements (a batch of starts, a batch of outcomes) read every
    row by its key, and planning them at each call cost PostgreSQL about as much as running them
    (``bench/w1_burst.py --top``)."""
    with _session_plans(ONCE_BY_KEY):
        yield


@contextmanager
def _session_plans(settings: tuple[str, ...]) -> Iterator[None]:
    _runner_thread.settings = settings
    try:
        yield
    finally:
        _runner_thread.settings = None
        raw = journal_connection().connection
        if raw is not None and getattr(raw, SESSION_PLANS, None):
            with suppress(Exception):  # a broken connection is closed anyway
                _reset(raw)


def _reset(raw: Any) -> None:
    """The session's planner settings back to the project's own."""
    setattr(raw, SESSION_PLANS, None)
    setattr(raw, PLANNED_FOR, None)
    with raw.cursor() as cursor:
        cursor.execute("RESET plan_cache_mode")
        cursor.execute("RESET enable_seqscan")


@contextmanager
def bound_cursor(connection: Any, *, newest: int | None = None) -> Iterator[Any]:
    """A PostgreSQL cursor that sends parameters apart from the statement (server-side binding),
    and prepares it where ``prepares`` allows, so that PostgreSQL plans each fixed statement once
    per connection instead of at every call.

    Django's cursors splice parameters into the text; for the hot fixed statements of
    ``postgres.batch``, ``postgres.claims`` and ``postgres.trigger`` that costs more Python than the
    round trip, and planning them costs the database more than running them. Django's error
    translation and execute wrappers still apply; its own queries are never prepared.

    ``newest``: the highest journal sequence the statement touches, for plans kept once
    (``planned_once_by_key``): they are made again as the journal grows (``_replan_as_it_grows``).
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
        settings = getattr(_runner_thread, "settings", None)
        if settings and getattr(connection.connection, SESSION_PLANS, None) != settings:
            with connection.wrap_database_errors, connection.connection.cursor() as cursor:
                if getattr(connection.connection, SESSION_PLANS, None):
                    _reset(connection.connection)
                for setting in settings:
                    cursor.execute(setting)
            setattr(connection.connection, SESSION_PLANS, settings)
        if settings == ONCE_BY_KEY and newest is not None:
            with connection.wrap_database_errors:
                _replan_as_it_grows(connection.connection, newest)
    with connection.wrap_database_errors:
        raw = cursor_class(connection.connection)
    cursor = connection.make_debug_cursor(raw) if connection.queries_logged else connection.make_cursor(raw)
    with cursor:
        yield cursor


def _replan_as_it_grows(raw: Any, newest: int) -> None:
    """Drop the connection's prepared statements once the journal's newest row, ``newest``, has
    twice the sequence it had when their plans were made (and REPLAN_AFTER_ROWS more).

    A plan is made for the tables as they are. Made on a journal of a few rows, one that reads by
    key may pick an index where the key is not the first column and read all of it for each row:
    cheap then, not at twenty thousand rows. Made again at each doubling, the plan in use was made
    when the journal's newest row had at least half the sequence it has now: a handful of plans
    over a journal's life."""
    planned_for = getattr(raw, PLANNED_FOR, None)
    if planned_for is not None and newest < 2 * planned_for + REPLAN_AFTER_ROWS:
        return
    if planned_for is not None:
        import psycopg

        # psycopg forgets its prepared statements on seeing this command succeed.
        with psycopg.Cursor(raw) as cursor:
            cursor.execute("DEALLOCATE ALL")
    setattr(raw, PLANNED_FOR, newest)


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
