"""Fault injection for runner subprocesses, activated only by SCHEDULER_FAULT in the child.

The test side starts a runner through ``main()`` (see ``FaultyRunner``), which
calls ``install()`` before ``run_scheduler``. ``install()`` reads
SCHEDULER_FAULT, a comma-separated list of fault names, and monkeypatches the
product at one precise point; product code is never edited. Pauses write
``<SCHEDULER_FAULT_DIR>/<name>.reached`` when they are hit, then wait until the
test creates ``<name>.release`` (or until the test SIGKILLs the runner).

Faults:

- ``pause_before_start``: the claim is committed (row ``claimed``), the handler has not started.
- ``pause_after_handler``: the handler returned, its outcome is not written (row ``running``).
- ``pause_before_finish_update``: inside the finish transaction, before the fenced UPDATE.
- ``pause_before_finish_commit``: inside the finish transaction, after the UPDATE, before COMMIT.
- ``poison``: a task whose params hold ``"poison": true`` records its start, then ``os._exit(1)``.
- ``mysql_wait_timeout=N``: every connection of the runner sets SESSION wait_timeout = N.
"""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.processes import ROOT, RunnerProcess

ENTRY = "import tests.faults as faults; faults.main()"
POLL = 0.02


# -- child side ----------------------------------------------------------------


def _fault_dir() -> Path:
    return Path(os.environ["SCHEDULER_FAULT_DIR"])


def _reached(name: str, detail: str = "") -> None:
    path = _fault_dir() / f"{name}.reached"
    path.write_text(detail)


def _pause(name: str, detail: str = "") -> None:
    """Signal that the fault point was reached, then block until the test releases it."""
    _reached(name, detail)
    release = _fault_dir() / f"{name}.release"
    while not release.exists():
        time.sleep(POLL)


def _patch(target: Any, name: str, replacement: Any) -> None:
    setattr(target, name, replacement)


def _parse(spec: str) -> dict[str, str]:
    faults: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, value = item.partition("=")
        faults[name] = value
    return faults


def install() -> None:
    """Set Django up and patch the points named in SCHEDULER_FAULT (nothing when it is unset)."""
    import django

    django.setup()
    faults = _parse(os.environ.get("SCHEDULER_FAULT", ""))
    if not faults:
        return

    from scheduler_app import attempt, engine, journal
    from scheduler_app.models import Status

    if "pause_before_start" in faults:
        original_run_attempt = attempt.run_attempt  # the object engine imported by name

        @functools.wraps(original_run_attempt)
        def run_attempt(item: Any, node: str, clock: Any) -> None:
            _pause("pause_before_start", str(item.claim.execution.occurrence_id))
            original_run_attempt(item, node, clock)

        _patch(engine, "run_attempt", run_attempt)

    if "pause_after_handler" in faults:
        original_call_handler = attempt.call_handler

        @functools.wraps(original_call_handler)
        def call_handler(event: Any) -> Any:
            outcome = original_call_handler(event)
            _pause("pause_after_handler", event.context.occurrence_id)
            return outcome

        _patch(attempt, "call_handler", call_handler)

    finish_points = {"pause_before_finish_update", "pause_before_finish_commit"} & set(faults)
    if finish_points:
        original_transition = journal.transition
        paused = threading.Event()

        @functools.wraps(original_transition)
        def transition(sequence: int, from_status: str, to_status: str, **kwargs: Any) -> bool:
            finishing = (
                from_status == Status.RUNNING
                and to_status != Status.RUNNING
                and kwargs.get("token") is not None
                and not paused.is_set()
            )
            if finishing and "pause_before_finish_update" in finish_points:
                paused.set()
                _pause("pause_before_finish_update", str(sequence))
            moved = original_transition(sequence, from_status, to_status, **kwargs)
            if finishing and "pause_before_finish_commit" in finish_points:
                paused.set()
                _pause("pause_before_finish_commit", f"{sequence},{moved}")
            return moved

        _patch(journal, "transition", transition)

    if "poison" in faults:
        from tests import hooks

        original_hook = hooks.on_task_execute

        @functools.wraps(original_hook)
        def on_task_execute(event: Any) -> Any:
            if event.context.params.get("poison"):
                hooks._append_line(event)
                os._exit(1)
            return original_hook(event)

        _patch(hooks, "on_task_execute", on_task_execute)

    if "mysql_wait_timeout" in faults:
        from django.db.backends.signals import connection_created

        seconds = int(faults["mysql_wait_timeout"])

        def short_wait_timeout(sender: Any, connection: Any, **kwargs: Any) -> None:
            if connection.vendor == "mysql":
                with connection.connection.cursor() as cursor:
                    cursor.execute(f"SET SESSION wait_timeout = {seconds}")

        connection_created.connect(short_wait_timeout, weak=False)


def main() -> None:
    """Entry point of a faulty runner: ``python -c ENTRY <run_scheduler args>``."""
    install()
    from django.core.management import execute_from_command_line

    execute_from_command_line(["manage.py", "run_scheduler", *sys.argv[1:]])


# -- test side -----------------------------------------------------------------


class FaultyRunner(RunnerProcess):
    """A run_scheduler process like RunnerProcess, started through ``main()`` with SCHEDULER_FAULT set."""

    def __init__(
        self,
        side_effects: Path,
        fault_dir: Path,
        node_id: str,
        *args: str,
        fault: str = "",
        lease: float = 2,
        **env: str,
    ) -> None:
        from django.db import connection

        self.node_id = node_id
        environment = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PYTHONPATH": str(ROOT),
            "SCHEDULER_DB_NAME": connection.settings_dict["NAME"],
            "SCHEDULER_SIDE_EFFECTS": str(side_effects),
            "SCHEDULER_LEASE": str(lease),
            "SCHEDULER_FAULT": fault,
            "SCHEDULER_FAULT_DIR": str(fault_dir),
            **env,
        }
        command = [sys.executable, "-c", ENTRY, "--node-id", node_id, *args]
        self.process = subprocess.Popen(command, cwd=ROOT, env=environment, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()

    @property
    def alive(self) -> bool:
        return self.process.poll() is None


def reached(fault_dir: Path, name: str) -> str | None:
    """What the child wrote when it hit the fault point, or None if not yet."""
    path = fault_dir / f"{name}.reached"
    return path.read_text() if path.exists() else None


def release(fault_dir: Path, name: str) -> None:
    (fault_dir / f"{name}.release").touch()


def kill_other_connections() -> int:
    """Kill every other session on the test database (the runners'): PostgreSQL or MariaDB."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return len(cursor.fetchall())
        cursor.execute(
            "SELECT id FROM information_schema.processlist WHERE db = DATABASE() AND id <> CONNECTION_ID()"
        )
        ids = [thread_id for (thread_id,) in cursor.fetchall()]
        for thread_id in ids:
            cursor.execute(f"KILL {int(thread_id)}")
        return len(ids)


def other_connections() -> int:
    """How many other sessions are open on the test database (MariaDB)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COUNT(*) FROM information_schema.processlist WHERE db = DATABASE() AND id <> CONNECTION_ID()"
        )
        (count,) = cursor.fetchone()
    return int(count)


class BrokenRedis:
    """A TCP server on 127.0.0.1 that accepts, then closes at once (``close``) or never answers (``silent``)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.accepted = 0
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.1)
        self.port = self._server.getsockname()[1]
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            if self.mode == "close":
                client.close()
            else:
                self._held.append(client)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._server.close()
        for client in self._held:
            client.close()
