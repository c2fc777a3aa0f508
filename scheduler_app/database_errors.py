"""What a database error means for an operator: its cause and the fix, in one line without secrets.

Driver messages can hold SQL, parameters and (for some drivers) parts of the
connection string, so they are read here to classify the error and never shown.
"""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS, connections

SQLITE_SETTINGS = (
    "set DATABASES OPTIONS {'transaction_mode': 'IMMEDIATE', 'timeout': 20} (docs/operations.md, SQLite)"
)
DEFAULT_PORTS = {"postgresql": "5432", "postgis": "5432", "mysql": "3306"}
# MySQL/MariaDB client and server error numbers.
MYSQL_CAUSES = {
    1044: "access_denied",
    1045: "access_denied",
    1049: "unknown_database",
    1054: "old_schema",
    1146: "missing_tables",
    2002: "refused",
    2003: "refused",
    2005: "unknown_host",
    2006: "lost",
    2013: "lost",
    1213: "deadlock",
}
# PostgreSQL SQLSTATEs, and libpq's connection messages (which carry no SQLSTATE).
POSTGRES_CODES = {
    "42P01": "missing_tables",
    "42703": "old_schema",
    "3D000": "unknown_database",
    "40P01": "deadlock",
}
TEXT_CAUSES = (
    ("no such table", "missing_tables"),
    ("no such column", "old_schema"),
    ("database is locked", "locked"),
    ("unable to open database file", "cannot_open"),
    ("connection refused", "refused"),
    ("is the server running", "refused"),
    ("failed to resolve host", "unknown_host"),
    ("could not translate host name", "unknown_host"),
    ("password authentication failed", "access_denied"),
    ("no password supplied", "access_denied"),
    ("no pg_hba.conf entry", "access_denied"),
    ('role "', "unknown_role"),
    ("does not exist", "unknown_database"),
    ("timeout expired", "timeout"),
    ("server closed the connection", "lost"),
    ("terminating connection", "lost"),
    ("the connection is closed", "lost"),
    ("connection already closed", "lost"),
)


def cause_of(exc: BaseException) -> str:
    """A stable name for why ``exc`` happened: missing_tables, refused, locked, ... or "other"."""
    for error in _chain(exc):
        code = code_of(error)
        if isinstance(code, int) and code in MYSQL_CAUSES:
            return MYSQL_CAUSES[code]
        if isinstance(code, str) and code in POSTGRES_CODES:
            return POSTGRES_CODES[code]
    text = " ".join(str(error) for error in _chain(exc)).lower()
    for fragment, cause in TEXT_CAUSES:
        if fragment in text:
            return cause
    return "other"


# What an operator reads for each cause: {where} is the database, {user} its USER, {sqlite} the fix.
MESSAGES = {
    "missing_tables": "the scheduler's tables do not exist in {where}: run `manage.py migrate`",
    "old_schema": "the scheduler's tables in {where} are older than this version: run `manage.py migrate`",
    "locked": "{where} is locked by another connection: {sqlite}",
    "cannot_open": "{where} cannot be opened: check that its file and folder exist and are writable",
    "refused": "cannot connect to {where}: connection refused (is the server running on that host and port?)",
    "unknown_host": "cannot connect to {where}: the host name does not resolve",
    "access_denied": "{where} refused the credentials of user {user!r}: check USER and PASSWORD",
    "unknown_role": "{where} has no user {user!r}: check USER",
    "unknown_database": "{where} does not exist: create it or check NAME",
    "timeout": "cannot connect to {where}: the connection timed out",
    "lost": "the connection to {where} was lost",
}


def describe(exc: BaseException, using: str = DEFAULT_DB_ALIAS) -> str:
    """One line for an operator: what failed on which database, and what to do; no driver text."""
    where = location(using)
    template = MESSAGES.get(cause_of(exc))
    if template is None:
        return f"{where} failed ({_kind(exc)})"
    return template.format(where=where, user=_setting(using, "USER"), sqlite=SQLITE_SETTINGS)


def location(using: str = DEFAULT_DB_ALIAS) -> str:
    """Which database an alias names, for messages: vendor, name, host and port, never the password."""
    if using not in connections.settings:
        return f"database {using!r}"
    # The ENGINE's last part (postgresql, mysql, sqlite3, postgis...): no connection is opened.
    engine = _setting(using, "ENGINE").rsplit(".", 1)[-1]
    name = _setting(using, "NAME")
    alias = "" if using == DEFAULT_DB_ALIAS else f" (alias {using!r})"
    if engine.startswith("sqlite"):
        return f"SQLite database {name!r}{alias}"
    host = _setting(using, "HOST") or "localhost"
    port = _setting(using, "PORT") or DEFAULT_PORTS.get(engine, "")
    address = f"{host}:{port}" if port else host
    return f"{engine} database {name!r} at {address}{alias}"


def _setting(using: str, key: str) -> str:
    return str(connections.settings[using].get(key) or "")


def _kind(exc: BaseException) -> str:
    """The error's class names (Django's, then the driver's) and its code, never its message."""
    names = []
    for error in _chain(exc):
        code = code_of(error)
        names.append(type(error).__name__ + (f" {code}" if code is not None else ""))
    return ", ".join(dict.fromkeys(names))


def code_of(error: BaseException) -> str | int | None:
    """One error's code: PostgreSQL's SQLSTATE, or MySQL's error number; None for others."""
    sqlstate = getattr(error, "sqlstate", None)
    if isinstance(sqlstate, str):
        return sqlstate
    args = getattr(error, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _chain(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain and len(chain) < 5:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain
