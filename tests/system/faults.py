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
- ``pause_before_finish_update``: inside the finish transaction, before the fenced UPDATE (on
  PostgreSQL, before the writer's one finish statement, which the fault wraps in a transaction).
- ``pause_before_finish_commit``: inside the finish transaction, after the UPDATE, before COMMIT.
- ``poison``: a task whose params hold ``"poison": true`` records its start, then ``os._exit(1)``.
- ``mysql_wait_timeout=N``: every connection of the runner sets SESSION wait_timeout = N.
- ``pause_in_claim``: once, inside the claim transaction, right after the SELECT ... FOR UPDATE of
  due executions (rows locked, nothing committed); ``.reached`` holds the session's backend id.
- ``pause_in_renewal``: once, right before the UPDATE that extends the leases of in-flight
  attempts; ``.reached`` holds the session's backend id.
- ``renew_fails``: every lease-renewal UPDATE raises OperationalError (the rest of the tick works).
- ``no_self_fence``: the runner never cancels an attempt on its own clock (``cancel_overdue`` does
  nothing), so a late write reaches the database fence.
- ``probe_delay=S``: the probe's answer reaches the runner S seconds after the database read its
  clock (a slow server, network or process), every tick.
- ``ticker``: a task whose params hold ``"ticker": S`` records its start, then appends
  ``<task>,<occurrence>,<attempt>,tick,<unix time>`` to ``<pid>.ticks`` every 20 ms until it is
  cancelled (one more line ``...,cancelled,<unix time>``) or S seconds have passed; with
  ``"ticker_attempts": N`` only attempts up to N tick, later ones run the suite's hook.
- ``db_stamp``: each start also appends ``<task>,<occurrence>,<attempt>,<database now>`` to
  ``<pid>.stamps``, the database clock read by the worker as the handler starts.

The SQL-level points (``pause_in_claim``, ``pause_in_renewal``, ``renew_fails``, ``probe_delay``)
recognise statements by their shape through a connection execute wrapper, so they survive
refactoring of the modules that issue them.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.system.processes import ROOT, RunnerProcess
from tests.system.processes import starts as side_effect_starts

ENTRY = "import tests.system.faults as faults; faults.main()"
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

    from scheduler_app import journal
    from scheduler_app.models import Status
    from scheduler_app.runner import attempt, claims, loop

    if "pause_before_start" in faults:
        original_run_attempt = attempt.run_attempt  # the object the loop imported by name

        @functools.wraps(original_run_attempt)
        def run_attempt(item: Any, node: str, clock: Any) -> None:
            _pause("pause_before_start", str(item.claim.execution.occurrence_id))
            original_run_attempt(item, node, clock)

        _patch(loop, "run_attempt", run_attempt)

        # A claim starts the attempts that waiting workers take at once: here every attempt is
        # left claimed, for its worker to start after the pause.
        original_claim = claims.claim

        @functools.wraps(original_claim)
        def claim(*args: Any, start: int = 0, **kwargs: Any) -> Any:
            return original_claim(*args, **kwargs)

        _patch(claims, "claim", claim)

    if "pause_after_handler" in faults:
        original_call_handler = attempt.call_handler

        @functools.wraps(original_call_handler)
        def call_handler(event: Any, **options: Any) -> Any:
            outcome = original_call_handler(event, **options)
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

        # On PostgreSQL the journal writer records outcomes with one statement (postgres.batch.finish),
        # in autocommit. Run here in a transaction of its own, it offers the same two points.
        from django.db import transaction

        from scheduler_app.postgres import batch as pg_batch

        original_finish = pg_batch.finish

        @functools.wraps(original_finish)
        def finish(finishes: Any, node: str, now: Any) -> Any:
            first = not paused.is_set()
            paused.set()
            sequences = ",".join(str(f.attempt.claim.execution.sequence) for f in finishes)
            with transaction.atomic():
                if first and "pause_before_finish_update" in finish_points:
                    _pause("pause_before_finish_update", sequences)
                recorded = original_finish(finishes, node, now)
                if first and "pause_before_finish_commit" in finish_points:
                    _pause("pause_before_finish_commit", f"{sequences},{bool(recorded)}")
            return recorded

        _patch(pg_batch, "finish", finish)

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

    if {"pause_in_claim", "pause_in_renewal", "renew_fails", "probe_delay"} & set(faults):
        _install_sql_faults(faults)

    if {"ticker", "db_stamp"} & set(faults):
        _install_hook_faults(faults)

    if "no_self_fence" in faults:
        _patch(loop.SchedulerLoop, "cancel_overdue", lambda self: None)


def _normalised(sql: str) -> str:
    return re.sub(r"\s+", " ", sql.replace('"', "").replace("`", "")).strip().lower()


def _backend_id(connection: Any) -> str:
    raw = connection.connection
    if connection.vendor == "postgresql":
        return str(raw.info.backend_pid)
    if connection.vendor == "mysql":
        return str(raw.thread_id())
    return ""


def _on_statements(wrapper: Callable[..., Any]) -> None:
    """Install ``wrapper(execute, sql, params, many, context, connection)`` on every new connection."""
    from django.db.backends.signals import connection_created

    def install_wrapper(sender: Any, connection: Any, **kwargs: Any) -> None:
        connection.execute_wrappers.append(functools.partial(_call_with_connection, wrapper, connection))

    connection_created.connect(install_wrapper, weak=False)


def _call_with_connection(
    wrapper: Callable[..., Any],
    connection: Any,
    execute: Any,
    sql: str,
    params: Any,
    many: bool,
    context: Any,
) -> Any:
    return wrapper(execute, sql, params, many, context, connection)


def _is_claim_select(sql: str, params: Any) -> bool:
    text = _normalised(sql)
    return (
        text.startswith("select")
        and "from scheduler_app_execution" in text
        and "for update" in text
        and "lease_expires_at" not in text.split(" where ", 1)[-1]
        and ("pending" in [str(value) for value in (params or ())] or "status = 'pending'" in text)
    )


def _is_lease_renewal(sql: str) -> bool:
    return _normalised(sql).startswith("update scheduler_app_execution set lease_expires_at =")


def _is_probe(sql: str) -> bool:
    text = _normalised(sql)
    return text.startswith("select") and "min(next_run_at)" in text and "min(lease_expires_at)" in text


def _install_sql_faults(faults: dict[str, str]) -> None:
    from django.db import OperationalError

    once: set[str] = set()
    delay = float(faults["probe_delay"]) if "probe_delay" in faults else 0.0

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any, connection: Any) -> Any:
        if "pause_in_renewal" in faults and "pause_in_renewal" not in once and _is_lease_renewal(sql):
            once.add("pause_in_renewal")
            _pause("pause_in_renewal", _backend_id(connection))
        if "renew_fails" in faults and _is_lease_renewal(sql):
            raise OperationalError("lease renewal refused (fault injection)")
        result = execute(sql, params, many, context)
        if "pause_in_claim" in faults and "pause_in_claim" not in once and _is_claim_select(sql, params):
            once.add("pause_in_claim")
            _pause("pause_in_claim", _backend_id(connection))
        if delay and _is_probe(sql):
            time.sleep(delay)
        return result

    _on_statements(wrapper)


def _side_file(suffix: str) -> Path | None:
    folder = os.environ.get("SCHEDULER_SIDE_EFFECTS")
    return Path(folder) / f"{os.getpid()}.{suffix}" if folder else None


def _write_side_line(suffix: str, line: str) -> None:
    path = _side_file(suffix)
    if path is None:
        return
    with open(path, "a") as handle:
        handle.write(line + "\n")
        handle.flush()


def _install_hook_faults(faults: dict[str, str]) -> None:
    from tests import hooks

    original_hook = hooks.on_task_execute

    @functools.wraps(original_hook)
    def on_task_execute(event: Any) -> Any:
        context = event.context
        prefix = f"{context.task_id},{context.occurrence_id},{context.attempt}"
        if "db_stamp" in faults:
            from django.db import connection

            with connection.cursor() as cursor:
                cursor.execute(
                    f"SELECT {'statement_timestamp()' if connection.vendor == 'postgresql' else 'UTC_TIMESTAMP(6)'}"
                )
                (now,) = cursor.fetchone()
            _write_side_line("stamps", f"{prefix},{now.replace(tzinfo=None).isoformat()}")
        seconds = context.params.get("ticker") if "ticker" in faults else None
        if seconds and context.attempt <= context.params.get("ticker_attempts", context.attempt):
            hooks._append_line(event)
            deadline = time.monotonic() + float(seconds)
            while time.monotonic() < deadline:
                _write_side_line("ticks", f"{prefix},tick,{time.time():.6f}")
                if event.cancelled.wait(0.02):
                    _write_side_line("ticks", f"{prefix},cancelled,{time.time():.6f}")
                    return {"ticked": "cancelled"}
            return {"ticked": True}
        return original_hook(event)

    _patch(hooks, "on_task_execute", on_task_execute)


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


# MariaDB's error for a KILL of a session that no longer exists.
UNKNOWN_THREAD = 1094


def kill_other_connections() -> int:
    """Kill every other session on the test database (the runners'): PostgreSQL or MariaDB; how many."""
    from django.db import OperationalError, connection

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
        killed = 0
        for (thread_id,) in cursor.fetchall():
            try:
                cursor.execute(f"KILL {int(thread_id)}")
            except OperationalError as exc:
                # A session that ended between the list and the KILL (a worker closing its own).
                if exc.args[0] != UNKNOWN_THREAD:
                    raise
            else:
                killed += 1
        return killed


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


def kill_backend(backend_id: str) -> None:
    """Kill one session of the test database server by its backend id (PostgreSQL pid, MariaDB thread)."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_terminate_backend(%s)", [int(backend_id)])
            (done,) = cursor.fetchone()
            assert done, f"backend {backend_id} was not terminated"
        else:
            cursor.execute(f"KILL {int(backend_id)}")


def side_lines(folder: Path, suffix: str) -> list[list[str]]:
    """The comma-split lines the ``ticker`` (suffix ``ticks``) or ``db_stamp`` (``stamps``) faults wrote."""
    rows: list[list[str]] = []
    for path in sorted(folder.glob(f"*.{suffix}")):
        rows.extend(line.split(",") for line in path.read_text().splitlines() if line)
    return rows


def ticks(folder: Path, occurrence_id: Any) -> list[tuple[str, float]]:
    """(kind, unix time) of every line the ticker wrote for one occurrence, in time order."""
    rows = [(row[3], float(row[4])) for row in side_lines(folder, "ticks") if row[1] == str(occurrence_id)]
    return sorted(rows, key=lambda row: row[1])


def stamps(folder: Path) -> dict[str, datetime]:
    """Occurrence id -> the database clock when its handler started (``db_stamp``)."""
    from datetime import UTC

    return {
        row[1]: datetime.fromisoformat(row[3]).replace(tzinfo=UTC) for row in side_lines(folder, "stamps")
    }


class ThrowawayPostgres:
    """A PostgreSQL cluster of its own on a free loopback port, so a test may stop and restart it.

    The machine's shared server is never touched. As root the binaries run as the ``postgres``
    user (initdb refuses root); the data directory lives in a temporary directory it owns.
    """

    def __init__(self) -> None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=_version_key)
        if not found:
            raise FileNotFoundError("no PostgreSQL server binaries under /usr/lib/postgresql")
        self.bin = Path(found[-1]).parent
        self.root = Path(tempfile.mkdtemp(prefix="scheduler-outage-"))
        self.data = self.root / "data"
        with socket.create_server(("127.0.0.1", 0)) as probe:
            self.port = probe.getsockname()[1]
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")

    def _run(self, program: str, *args: str, timeout: float = 120) -> None:
        command = [str(self.bin / program), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=timeout)

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-o", options, "-w", "start"
        )

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def connect(self, dbname: str = "postgres") -> Any:
        import psycopg

        return psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname=dbname, autocommit=True
        )

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):  # not running
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def _version_key(path: str) -> tuple[int, ...]:
    version = Path(path).parent.parent.name
    return tuple(int(part) for part in version.split(".") if part.isdigit())


class Runners:
    """Starts faulty runners; kills whatever is left at teardown."""

    def __init__(self, root: Path) -> None:
        self.effects = root / "effects"
        self.fault_dir = root / "faults"
        self.effects.mkdir()
        self.fault_dir.mkdir()
        self.started: list[FaultyRunner] = []

    def start(self, node_id: str, *args: str, fault: str = "", lease: float = 2, **env: str) -> FaultyRunner:
        process = FaultyRunner(
            self.effects,
            self.fault_dir,
            node_id,
            "--tick-interval",
            "0.2",
            *args,
            fault=fault,
            lease=lease,
            **env,
        )
        self.started.append(process)
        return process

    def starts(self) -> Counter[str]:
        return side_effect_starts(self.effects)

    def ticks(self, occurrence_id: Any) -> list[tuple[str, float]]:
        return ticks(self.effects, occurrence_id)

    def reached(self, name: str) -> str | None:
        return reached(self.fault_dir, name)

    def release(self, name: str) -> None:
        release(self.fault_dir, name)
