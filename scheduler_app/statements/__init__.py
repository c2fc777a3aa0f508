"""The journal's hot statements, one object per database connection (as Django's ``connection.ops``).

``journal_statements()`` chooses once per connection: PostgreSQL through psycopg 3 gets the
fixed statements of ``scheduler_app.postgres`` (server-bound parameters, one statement per
batch of moves); every other database the ORM's (``orm.Statements``). No other module asks
which database it runs on.
"""

from __future__ import annotations

from typing import Any

from django.db import connections, router

from scheduler_app.models import Execution
from scheduler_app.statements.orm import ORM, Statements

__all__ = ["ORM", "Statements", "journal_statements"]

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
