"""Wake-ups through PostgreSQL's LISTEN/NOTIFY, for runners on PostgreSQL without Redis.

A trigger's own statement carries a wake-up (``pg_notify``, delivered at its commit) when none
went out for ``wakeup.SPACING``; otherwise it asks ``wakeup.notify`` for one, and a thread of
the process sends ``NOTIFY`` on a short-lived connection unless a later trigger carried one, so
the trigger never waits for it. Runners ``LISTEN`` on a connection of their own. Like Redis, it only speeds things up: a lost
notification is found by the next tick.

Not used behind a transaction-mode pooler (``DISABLE_SERVER_SIDE_CURSORS``): LISTEN needs a
session of its own.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.db import connections

from scheduler_app import database_errors

logger = logging.getLogger("scheduler_app")

CHANNEL = "scheduler_app_wake"


def alias() -> str:
    """The journal's database: notifications go where triggers commit."""
    from scheduler_app.postgres.binding import journal_connection

    return str(journal_connection().alias)


def available() -> bool:
    """Whether the journal's PostgreSQL is reached without a transaction-mode pooler."""
    from scheduler_app.postgres.binding import journal_connection

    return not journal_connection().settings_dict.get("DISABLE_SERVER_SIDE_CURSORS", False)


def connect() -> Any:
    """A connection of its own, in autocommit, with the journal database's settings."""
    import psycopg

    params = connections[alias()].get_connection_params()
    params.pop("cursor_factory", None)
    return psycopg.connect(**params, autocommit=True)


class Outage:
    """Logs an outage once when it starts (WARNING, with its cause) and once when it ends."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._down = False

    def failed(self, exc: BaseException) -> None:
        if not self._down:
            self._down = True
            logger.warning(
                "%s: %s; runners see work at their next tick instead",
                self._what,
                database_errors.describe(exc, alias()),
            )

    def succeeded(self) -> None:
        if self._down:
            self._down = False
            logger.warning("%s: %s reachable again", self._what, database_errors.location(alias()))


class Sender:
    """Sends NOTIFY for the wake-up thread of ``wakeup``, each time on a connection opened for it
    and closed at once: a process that triggers keeps no connection open for wake-ups (one kept
    would, for one, stop a test runner from dropping its test database)."""

    def __init__(self) -> None:
        self._outage = Outage("wake-ups not sent")

    def send(self) -> None:
        try:
            with connect() as connection:
                connection.execute(f"NOTIFY {CHANNEL}")
        except Exception as exc:
            self._outage.failed(exc)
        else:
            self._outage.succeeded()


SENDER = Sender()


class Listener(threading.Thread):
    """Sets ``wake`` (and ``heard``) at every notification; reconnects after errors. ``listening``
    is set while its LISTEN is in place: a NOTIFY sent before that is not heard."""

    RETRY_SECONDS = 5.0

    def __init__(self, wake: threading.Event) -> None:
        super().__init__(name="scheduler-pg-listener", daemon=True)
        self._wake = wake
        self.heard = threading.Event()
        self.listening = threading.Event()
        self._stop_event = threading.Event()
        self._outage = Outage("runner not woken by triggers")

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                with connect() as connection:
                    connection.execute(f"LISTEN {CHANNEL}")
                    self.listening.set()
                    self._outage.succeeded()
                    while not self._stop_event.is_set():
                        for _ in connection.notifies(timeout=0.5, stop_after=1):
                            self.heard.set()
                            self._wake.set()
            except Exception as exc:
                self.listening.clear()
                self._outage.failed(exc)
                self._stop_event.wait(self.RETRY_SECONDS)

    def stop(self) -> None:
        self._stop_event.set()
