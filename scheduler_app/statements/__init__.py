"""The journal's hot statements, one object per database connection (as Django's ``connection.ops``).

``journal_statements()`` chooses once per connection: PostgreSQL through psycopg 3 gets the
fixed statements of ``scheduler_app.postgres`` (server-bound parameters, one statement per
batch of moves); every other database the ORM's (``orm.Statements``). No other module asks
which database it runs on.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connections, router, transaction

from scheduler_app.models import Execution
from scheduler_app.statements.orm import ORM, Statements

__all__ = ["ORM", "Statements", "compiled_without_jit", "journal_statements"]

# Where the chosen statements are kept on a connection.
ATTRIBUTE = "_scheduler_statements"


def journal_statements(connection: Any = None) -> Statements:
    """The statements of ``connection``, by default the journal's (the router's choice for
    Execution); chosen once per connection."""
    if connection is None:
        connection = connections[router.db_for_write(Execution)]
    chosen: Statements | None = getattr(connection, ATTRIBUTE, None)
    if chosen is None:
        chosen = _choose(connection)
        setattr(connection, ATTRIBUTE, chosen)
    return chosen


def _choose(connection: Any) -> Statements:
    if connection.vendor == "postgresql":
        from django.db.backends.postgresql.psycopg_any import is_psycopg3

        if is_psycopg3:
            # Imported here: the PostgreSQL statements extend the ORM's, which this package holds.
            from scheduler_app.postgres.statements import POSTGRES

            return POSTGRES
    return ORM


@contextmanager
def compiled_without_jit(alias: str) -> Iterator[None]:
    """What runs inside, in one transaction, without PostgreSQL's JIT compilation; elsewhere as it is.

    A list that works out each task's health holds a dozen subqueries per row: over a hundred
    thousand tasks PostgreSQL estimates it costly enough to compile it to machine code first,
    which takes two seconds, for a page that reads a hundred rows in a tenth of one.
    """
    connection = connections[alias]
    if connection.vendor != "postgresql":
        yield
        return
    with transaction.atomic(using=alias):
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL jit = off")
        yield
