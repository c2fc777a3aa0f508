"""Shared helpers for the benchmark scripts: a throw-away database, runner processes, RSS, percentiles.

Not a benchmark itself. Every script does, in this order:

    with bench_database("bench_x", db) as info:   # creates, configures Django, migrates; drops on exit
        with Processes() as procs:                  # children get SIGTERM (then SIGKILL) on exit
            procs.start_runner(info, "--workers", "8")
            ...
    write_results("x", {...})                        # bench/results/x.json
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def pg_conninfo() -> str:
    return (
        f"host={os.environ.get('PGHOST', '127.0.0.1')} port={os.environ.get('PGPORT', '5432')} user=postgres"
    )


MYSQL = {"host": os.environ.get("MYSQL_HOST", "127.0.0.1"), "port": int(os.environ.get("MYSQL_PORT", "3306"))}


def _raise_system_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


# SIGTERM to a bench script unwinds like Ctrl-C, so every `finally` (child cleanup, DROP DATABASE) runs.
signal.signal(signal.SIGTERM, _raise_system_exit)
signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with SIGINT ignored (`cmd &`)


# -- database ---------------------------------------------------------------


@dataclass
class DatabaseInfo:
    backend: str  # postgres | mysql | sqlite
    name: str  # database name, or file path for sqlite
    env: dict[str, str] = field(default_factory=dict)  # what a child process needs to reach it


def _pg_admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(pg_conninfo() + " dbname=postgres", autocommit=True) as conn:
        conn.execute(sql)


def _mysql_admin(sql: str) -> None:
    import MySQLdb  # type: ignore[import-untyped]

    conn = MySQLdb.connect(user="root", passwd="", **MYSQL)
    try:
        conn.cursor().execute(sql)
    finally:
        conn.close()


def _create(backend: str, name: str) -> None:
    if backend == "postgres":
        _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        _pg_admin(f'CREATE DATABASE "{name}"')
    elif backend == "mysql":
        _mysql_admin(f"DROP DATABASE IF EXISTS `{name}`")
        _mysql_admin(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    else:
        _drop(backend, name)


def _drop(backend: str, name: str) -> None:
    if backend == "postgres":
        _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    elif backend == "mysql":
        _mysql_admin(f"DROP DATABASE IF EXISTS `{name}`")
    else:
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(name + suffix).unlink(missing_ok=True)


# pg_stat_statements also times each statement's planning: for --top, whose figures it slows a little.
TRACK_PLANNING = {"pg_stat_statements.track_planning": "on"}


@contextmanager
def private_postgres(port: int = 5544, settings: dict[str, str] | None = None) -> Iterator[None]:
    """A throw-away PostgreSQL cluster on ``port`` with pg_stat_statements loaded; PGPORT points at it.

    Durable commits as on the machine's own server (fsync and synchronous_commit
    on); only the statistics module differs, and any server ``settings`` given (name: value). Needs the server binaries and, as
    root, the ``postgres`` user. Stopped and deleted on exit.
    """
    bin_dir = sorted(Path("/usr/lib/postgresql").glob("*/bin"))[-1]
    folder = Path(tempfile.mkdtemp(prefix="bench-pg-"))
    data = folder / "data"
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_postgres:
        shutil.chown(folder, "postgres", "postgres")
    run = {"check": True, "stdout": subprocess.DEVNULL, "stderr": subprocess.STDOUT}
    subprocess.run(
        [*as_postgres, str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust"], **run
    )
    options = (
        f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on"
        " -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all -c max_connections=200"
    ) + "".join(f" -c {name}={value}" for name, value in (settings or {}).items())
    subprocess.run(
        [
            *as_postgres,
            str(bin_dir / "pg_ctl"),
            "-D",
            str(data),
            "-o",
            options,
            "-l",
            str(folder / "log"),
            "-w",
            "start",
        ],
        **run,
    )
    previous = os.environ.get("PGPORT")
    os.environ["PGPORT"] = str(port)
    try:
        yield
    finally:
        subprocess.run(
            [*as_postgres, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            **{**run, "check": False},
        )
        shutil.rmtree(folder, ignore_errors=True)
        if previous is None:
            os.environ.pop("PGPORT", None)
        else:
            os.environ["PGPORT"] = previous


@contextmanager
def bench_database(
    name: str, backend: str = "postgres", *, redis_url: str | None = None, settings: str = "tests.settings"
) -> Iterator[DatabaseInfo]:
    """Create database ``name``, point Django (tests.settings) at it, migrate; drop it on exit.

    Call once per process, before importing models: Django reads the settings once.
    """
    if backend == "sqlite":
        name = os.path.join(tempfile.gettempdir(), f"{name}.sqlite3")
    env = {
        "DJANGO_SETTINGS_MODULE": settings,
        "SCHEDULER_TEST_DB": backend,
        "SCHEDULER_DB_NAME": name,
        "SCHEDULER_REDIS_URL": redis_url or "",
        "PYTHONPATH": str(ROOT),
    }
    os.environ.update(env)
    _create(backend, name)
    try:
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)
        yield DatabaseInfo(backend, name, env)
    finally:
        try:
            from django.db import connections

            connections.close_all()
        except Exception:
            pass
        _drop(backend, name)


def seed_history(task_id: str, n: int) -> None:
    """``n`` finished executions of ``task_id``: the journal of a deployment that has been running."""
    import uuid
    from datetime import timedelta

    from django.utils import timezone

    from scheduler_app.models import Execution, Status, TriggerType

    start = timezone.now() - timedelta(days=1)
    rows = [
        Execution(
            occurrence_id=uuid.uuid4(),
            task_id=task_id,
            task_revision=1,
            trigger_type=TriggerType.MANUAL,
            trigger_source="history",
            due_at=start + timedelta(seconds=i),
            status=Status.SUCCESS,
            attempt=1,
            created_at=start + timedelta(seconds=i),
            started_at=start + timedelta(seconds=i),
            finished_at=start + timedelta(seconds=i),
            updated_at=start + timedelta(seconds=i),
            log_persistence="persisted",
        )
        for i in range(n)
    ]
    Execution.objects.bulk_create(rows, batch_size=1000)


def cpu_seconds(pids: set[int]) -> dict[str, float]:
    """CPU seconds (user + system) so far of this process, of ``pids``, and of every PostgreSQL
    server process on the machine (the private cluster's, unless --shared-pg), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {"this process": 0.0, "given processes": 0.0, "postgres": 0.0}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                command = handle.read()
        except OSError:
            continue
        seconds = (int(fields[11]) + int(fields[12])) / tick
        if int(entry) == os.getpid():
            out["this process"] += seconds
        elif int(entry) in pids:
            out["given processes"] += seconds
        elif command.startswith(b"postgres"):
            out["postgres"] += seconds
    return out


def analyze() -> None:
    """Refresh planner statistics after a bulk insert (PostgreSQL and MySQL)."""
    from django.db import connection

    from scheduler_app.models import Execution, Task

    with connection.cursor() as cursor:
        for model in (Task, Execution):
            table = connection.ops.quote_name(model._meta.db_table)
            if connection.vendor == "postgresql":
                cursor.execute(f"ANALYZE {table}")
            elif connection.vendor == "mysql":
                cursor.execute(f"ANALYZE TABLE {table}")
                cursor.fetchall()


# -- child processes ---------------------------------------------------------


@dataclass
class Child:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    peak_rss_kb: int = 0

    def sample_rss(self) -> int:
        """Refresh the peak RSS (VmHWM) from /proc while the process is alive."""
        self.peak_rss_kb = max(self.peak_rss_kb, vm_hwm_kb(self.popen.pid) or 0)
        return self.peak_rss_kb

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Processes:
    """Children started here are stopped on exit: SIGTERM, then SIGKILL after ``grace`` seconds."""

    def __init__(self, grace: float = 40.0) -> None:
        self.children: list[Child] = []
        self.grace = grace
        self.folder = Path(tempfile.mkdtemp(prefix="bench-procs-"))

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()
        shutil.rmtree(self.folder, ignore_errors=True)

    def start(self, name: str, argv: Sequence[str], env: dict[str, str]) -> Child:
        log_path = self.folder / f"{name}.log"
        log: IO[bytes] = open(log_path, "wb")  # noqa: SIM115 - owned by the child
        popen = subprocess.Popen(
            list(argv),
            env={**os.environ, **env},
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in the terminal reaches only us; we stop the children
        )
        log.close()
        child = Child(name, popen, log_path)
        self.children.append(child)
        return child

    def start_runner(
        self, db: DatabaseInfo, name: str, *args: str, env: dict[str, str] | None = None
    ) -> Child:
        argv = [sys.executable, "-m", "django", "run_scheduler", "--node-id", name, *args]
        return self.start(name, argv, {**db.env, **(env or {})})

    def terminate(self, child: Child, timeout: float | None = None) -> int | None:
        """SIGTERM one child and wait; its exit code, or None if it had to be killed."""
        self._signal(child)
        return self._wait(child, timeout)

    def stop_all(self) -> dict[str, int | None]:
        """SIGTERM every child, then wait for each: one signal each, since a runner takes a
        second one as the order to exit at once (status 1, without draining)."""
        for child in self.children:
            self._signal(child)
        return {child.name: self._wait(child) for child in self.children}

    def _signal(self, child: Child) -> None:
        if child.popen.poll() is None:
            child.sample_rss()
            child.popen.send_signal(signal.SIGTERM)

    def _wait(self, child: Child, timeout: float | None = None) -> int | None:
        try:
            return child.popen.wait(self.grace if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            child.popen.kill()
            child.popen.wait()
            return None


def workers_option(workers: int | None) -> tuple[str, ...]:
    """run_scheduler's --workers, or nothing (the WORKERS setting) when ``workers`` is None."""
    return ("--workers", str(workers)) if workers else ()


def vm_hwm_kb(pid: int) -> int | None:
    """Peak resident set size of a live process, in kB (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


# -- figures -------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float | None:
    """Linear-interpolated percentile (p in 0-100), None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    k = (len(ordered) - 1) * p / 100
    low = math.floor(k)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


def summary(values: Sequence[float], digits: int = 3) -> dict[str, Any]:
    """count, min, p50, p90, p99, max, mean, rounded."""
    if not values:
        return {"count": 0}

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, digits)

    return {
        "count": len(values),
        "min": r(min(values)),
        "p50": r(percentile(values, 50)),
        "p90": r(percentile(values, 90)),
        "p99": r(percentile(values, 99)),
        "max": r(max(values)),
        "mean": r(sum(values) / len(values)),
    }


def write_results(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    print(f"results written to {path.relative_to(ROOT)}")
    return path


def wait_until(predicate: Any, timeout: float, interval: float = 0.2, on_poll: Any = None) -> bool:
    """Poll ``predicate`` until true or ``timeout`` seconds pass; ``on_poll`` runs each round."""
    deadline = time.monotonic() + timeout
    while True:
        if on_poll is not None:
            on_poll()
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


# -- database work ----------------------------------------------------------------


def pg_stat_statements_ready() -> bool:
    """Create the extension where the server preloads it (see private_postgres); False elsewhere."""
    from django.db import DatabaseError, connection, transaction

    if connection.vendor != "postgresql":
        return False
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            cursor.execute("SELECT count(*) FROM pg_stat_statements")
        return True
    except DatabaseError:
        return False


def pg_work() -> dict[str, int]:
    """Counters of the current database so far: commits, and statements and WAL bytes when available.

    Read on a connection of its own, outside Django, so the reading adds nothing but itself
    (and statements that mention pg_stat are left out of the sums).
    """
    from django.db import connection

    if connection.vendor != "postgresql":
        return {}
    import psycopg

    out: dict[str, int] = {}
    with psycopg.connect(
        f"{pg_conninfo()} dbname={connection.settings_dict['NAME']}", autocommit=True
    ) as conn:
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        out["commits"] = int(row[0]) if row else 0
        try:
            calls, wal = conn.execute(
                "SELECT coalesce(sum(calls), 0), coalesce(sum(wal_bytes), 0) FROM pg_stat_statements"
                " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
                " AND query NOT LIKE '%pg_stat%'"
            ).fetchone()
            out["statements"], out["wal_bytes"] = int(calls), int(wal)
        except psycopg.Error:
            pass
    return out


def pg_reset_statements() -> None:
    """Empty pg_stat_statements, so that pg_top_statements() speaks of what follows."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_statements_reset()")


def statement_line(row: dict[str, Any]) -> str:
    """One row of pg_top_statements as the scripts print it: total, planning, calls, mean, rows
    (returned or changed, over all calls), WAL bytes (over all calls) and the statement's start."""
    return (
        f"  {row['total_ms']:>9} ms {row['plan_ms']:>8} ms planning {row['calls']:>6} calls"
        f" {row['mean_ms']:>8} ms/call {row['rows']:>7} rows {row['wal_bytes']:>9} WAL bytes  {row['query']}"
    )


def pg_top_statements(limit: int) -> list[dict[str, Any]]:
    """The current database's statements that took the most time so far, from pg_stat_statements:
    calls, total and mean milliseconds (executing, and planning where the server tracks it: see
    TRACK_PLANNING), rows, WAL bytes, and the first 160 characters."""
    from django.db import connection

    if connection.vendor != "postgresql" or limit <= 0:
        return []
    import psycopg

    with psycopg.connect(
        f"{pg_conninfo()} dbname={connection.settings_dict['NAME']}", autocommit=True
    ) as conn:
        try:
            rows = conn.execute(
                "SELECT calls, total_exec_time, total_plan_time, rows, wal_bytes,"
                " left(regexp_replace(query, '\\s+', ' ', 'g'), 160)"
                " FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database"
                " WHERE datname = current_database()) AND query NOT LIKE '%%pg_stat%%'"
                " ORDER BY total_exec_time + total_plan_time DESC LIMIT %s",
                [limit],
            ).fetchall()
        except psycopg.Error:
            return []
    return [
        {
            "calls": calls,
            "total_ms": round(total, 1),
            "mean_ms": round(total / max(calls, 1), 3),
            "plan_ms": round(plan, 1),
            "rows": n,
            "wal_bytes": int(wal),
            "query": q,
        }
        for calls, total, plan, n, wal, q in rows
    ]


def per_execution(before: dict[str, int], after: dict[str, int], executions: int) -> dict[str, float]:
    """Database work between two pg_work() readings, divided by ``executions``."""
    return {
        key: round((after[key] - before[key]) / max(executions, 1), 2)
        for key in ("commits", "statements", "wal_bytes")
        if key in before and key in after
    }
