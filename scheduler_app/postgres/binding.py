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
# Set on a psycopg connection whose session keeps its plans (kept_plans).
KEEPS_PLANS = "_scheduler_keeps_plans"
# The session settings of kept plans; leaving kept_plans resets them.
KEPT_PLANS = {"plan_cache_mode": "force_generic_plan", "enable_seqscan": "off"}
# The newest journal row (its sequence) a connection's kept plans were made for.
PLANNED_FOR = "_scheduler_planned_for"
# Kept plans are made again once the journal's newest row has twice the sequence it had then,
# and never for fewer new rows than this.
REPLAN_AFTER_ROWS = 1000

# Whether this thread is a runner's loop or journal writer (kept_plans), and the newest journal
# row its statements have touched.
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
def kept_plans() -> Iterator[None]:
    """Within, each prepared statement of this thread's journal connection keeps the plan made at
    its first call (``plan_cache_mode = force_generic_plan`` on its session), made without
    sequential scans, until the journal has grown enough to plan it again (``_keep_plans``).

    Planning the runner's fixed statements at each call cost PostgreSQL about as much as running
    them (``bench/w2_manual.py --top``). PostgreSQL's own choice, a generic plan after a prepared
    statement's fifth call, is kept until the next ANALYZE of its tables: a runner's first calls
    meet an empty or small journal, where reading a whole table is the cheapest plan, and a burst
    of 10,000 executions a minute later read the whole journal at every batch of outcomes (4.5 ms
    a call instead of 0.8 ms). Only the runner's own threads do this: a web process's connection,
    and the workers that run handlers, keep the session as the project set it.
    """
    _runner_thread.active = True
    _runner_thread.newest = 0
    try:
        yield
    finally:
        _runner_thread.active = False
        raw = journal_connection().connection
        if raw is not None and getattr(raw, KEEPS_PLANS, False):
            setattr(raw, KEEPS_PLANS, False)
            setattr(raw, PLANNED_FOR, None)
            with suppress(Exception), raw.cursor() as cursor:  # a broken connection is closed anyway
                for name in KEPT_PLANS:
                    cursor.execute(f"RESET {name}")


def saw(newest: int) -> None:
    """Note the newest journal row (its sequence) a statement of this thread touched: its kept
    plans are made again once that has doubled."""
    if getattr(_runner_thread, "active", False) and newest > _runner_thread.newest:
        _runner_thread.newest = newest


def bound_cursor(connection: Any) -> Any:
    """A PostgreSQL cursor that sends parameters apart from the statement (server-side binding),
    and prepares it where ``prepares`` allows, so that PostgreSQL plans each fixed statement once
    per connection instead of at every call; a with block closes it.

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
        if getattr(_runner_thread, "active", False):
            with connection.wrap_database_errors:
                _keep_plans(connection.connection)
    with connection.wrap_database_errors:
        raw = cursor_class(connection.connection)
    return connection.make_debug_cursor(raw) if connection.queries_logged else connection.make_cursor(raw)


def _keep_plans(raw: Any) -> None:
    """Set the session of a runner's thread to keep its plans, and drop its prepared statements
    once the journal's newest row has twice the sequence (and REPLAN_AFTER_ROWS more) it had when
    their plans were made.

    A plan is made for the tables as they are. Made on a journal of a few rows, one that reads by
    key may pick an index where the key is not the first column and read all of it for each row:
    cheap then, not at twenty thousand rows. Made again at each doubling, the plan in use was made
    when the journal's newest row had at least half the sequence it has now: a handful of plans
    over a journal's life."""
    import psycopg

    if not getattr(raw, KEEPS_PLANS, False):
        if raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            return  # set outside a transaction, which could roll it back; this call plans as PostgreSQL does
        with psycopg.Cursor(raw) as cursor:
            for name, value in KEPT_PLANS.items():
                cursor.execute(f"SET {name} = {value}")
        setattr(raw, KEEPS_PLANS, True)
    newest = _runner_thread.newest
    planned_for = getattr(raw, PLANNED_FOR, None)
    if planned_for is not None and newest < 2 * planned_for + REPLAN_AFTER_ROWS:
        return
    if planned_for is not None:
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
