"""manage.py run_scheduler: a thin shell around runner.loop.SchedulerLoop."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import threading
from collections import deque
from collections.abc import Iterator
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError
from django.db import router
from django.db.backends.signals import connection_created

from scheduler_app import __version__
from scheduler_app.checks import check_javascript_tasks
from scheduler_app.conf import scheduler_settings
from scheduler_app.exceptions import SchedulerError
from scheduler_app.management.base import OfflineChecksCommand
from scheduler_app.models import Task
from scheduler_app.runner.loop import RunnerFailed, SchedulerLoop
from scheduler_app.services import validate_declared_tasks

logger = logging.getLogger("scheduler_app")

# Under DEBUG (a new project's default), Django logs each statement of a connection, keeping its
# last 9,000 for connection.queries. A web process empties that log at each request; a runner
# never would, so each of its connections keeps only its last DEBUG_STATEMENTS_KEPT instead.
DEBUG_STATEMENTS_KEPT = 100


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return number


def positive_float(value: str) -> float:
    number = float(value)
    if not number > 0:
        raise argparse.ArgumentTypeError("must be a positive number")
    return number


class Command(OfflineChecksCommand):
    help = "Run the scheduler loop: create, claim and run task executions."

    def get_version(self) -> str:
        return f"scheduler_app {__version__}"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--once", action="store_true", help="Run one tick, wait for its attempts, exit.")
        parser.add_argument(
            "--workers", type=positive_int, help="Attempts run at once (default WORKERS: 16, 4 on SQLite)."
        )
        parser.add_argument("--tick-interval", type=positive_float, help="Seconds between ticks.")
        parser.add_argument("--lease", type=positive_float, help="Lease length in seconds.")
        parser.add_argument("--node-id", help="This runner's id (default host:pid).")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["verbosity"] > 0 and not logging.getLogger("scheduler_app").handlers:
            logging.basicConfig(level=logging.INFO if options["verbosity"] > 1 else logging.WARNING)
        try:
            validate_declared_tasks(scheduler_settings.TASKS)
        except SchedulerError as exc:
            details = "; ".join(
                f"{field}: {' '.join(messages)}" for field, messages in exc.details.get("errors", {}).items()
            )
            raise CommandError(f"{exc.code}: {exc.message} {details}".strip()) from None
        runner = SchedulerLoop(
            node_id=options["node_id"],
            workers=options["workers"],
            tick_interval=options["tick_interval"],
            lease_seconds=options["lease"],
        )

        def announce() -> None:
            # The runner logs the line at INFO; printed too where that log is not shown.
            if options["verbosity"] > 0 and not logger.isEnabledFor(logging.INFO):
                self.stdout.write(runner.description())
            # The database check of this node's Python (W004), which manage.py check runs only on demand.
            for problem in check_javascript_tasks(databases=[router.db_for_read(Task)]):
                logger.warning("%s: %s %s", problem.id, problem.msg, problem.hint)

        with shut_down_on_signals(runner), few_statements_logged():
            try:
                runner.run(once=options["once"], on_start=announce)
            except RunnerFailed as exc:
                raise CommandError(str(exc)) from None
            except SchedulerError as exc:
                # refresh_tasks() refused the declarations (a collision, E039): no retry can help.
                raise CommandError(f"cannot start: {exc.code}: {exc.message}") from None


@contextlib.contextmanager
def few_statements_logged() -> Iterator[None]:
    """Under DEBUG, each database connection opened meanwhile logs at most DEBUG_STATEMENTS_KEPT
    statements (the runner's threads open their own)."""

    def keep_fewer(*, connection: Any, **kwargs: Any) -> None:
        if settings.DEBUG:
            connection.queries_log = deque(connection.queries_log, maxlen=DEBUG_STATEMENTS_KEPT)

    connection_created.connect(keep_fewer)
    try:
        yield
    finally:
        connection_created.disconnect(keep_fewer)


@contextlib.contextmanager
def shut_down_on_signals(runner: SchedulerLoop) -> Iterator[None]:
    """SIGTERM or SIGINT shuts ``runner`` down; a second one exits at once, with status 1.

    A Python signal handler runs in the main thread between two of its bytecodes, possibly
    while that thread holds a lock that shutdown() takes: Event.wait() re-acquires its
    Condition's lock when it wakes, and shutdown() sets that very Event. Called from the
    handler, shutdown() would wait for its own thread forever (the signal module's docs warn
    against locks in handlers). So the handler only writes a byte to a pipe, which takes no
    lock, and a thread of its own reads it and calls shutdown().
    """
    readable, writable = os.pipe()
    signals_seen = 0

    def relay() -> None:
        if os.read(readable, 1):  # b"" is the end of file: the command is ending
            runner.shutdown("shutdown")

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen > 1:
            os._exit(1)
        os.write(writable, b"\0")

    relaying = threading.Thread(target=relay, name="scheduler-signals", daemon=True)
    relaying.start()
    previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            # None: the handler was not set from Python; the default is what it was.
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        os.close(writable)
        relaying.join()
        os.close(readable)
