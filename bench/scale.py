"""Scale: the scheduler on a journal of millions of rows, against the same scheduler on an empty one.

Two databases on a private PostgreSQL cluster (port 5590), both with --tasks tasks ("scale-000001"
and on, cron "0 0 1 1 *": none is due during the run; one in twenty disabled) and their creation
in the audit trail:

* "empty": no execution at all (the empty-journal baseline);
* "filled": --executions executions spread over the tasks (skewed: the first tasks have
  thousands, the last a handful), ended over the last --days days (mostly success, 3 % failed,
  0.5 % interrupted, 0.1 % discarded, one in 16,000 unknown, 2 % triggered by hand), each with
  --events events (created, claimed, started, ended; 2 keeps the last two) and one log row.
  Filled by SQL (INSERT ... SELECT generate_series) with the tables' secondary indexes dropped
  and built again afterwards, then VACUUM ANALYZE; then the most recent --recent of the
  executions (5 %) with their events and logs, inserted with every index in place: the rows a
  running journal gained since autovacuum's last turn (--recent 0: W1 right after a vacuum of the
  whole journal, whose every event row goes to a gap the vacuum recorded in an old page).
  The seconds each step took are printed.

Measured on both, the figures of the filled one beside the empty one's:

1. Idle tick: statements and milliseconds of SchedulerLoop.tick() in this process when nothing is
   due (as bench/idle_tick.py), --ticks ticks; also on the empty database before its tasks exist.
2. W1: --w1-tasks tasks due at the same minute, run by two `run_scheduler` processes with every
   setting at its default (the no-op hook of bench/noop_hook.py): due-to-start p50 and p99 and
   duplicates. The passes alternate empty, filled, --repeat times; medians are compared. The
   W1 tasks, their executions, events and logs are deleted after each pass. For each pass: the
   blocks read from outside PostgreSQL's buffers, the WAL and its full-page images, the indexes
   that read most, the relations whose pages the WAL wrote whole most often (pg_walinspect), and
   the statements that took the most time.
3. Admin: server time of the execution list (default view, ?status=unknown, a task's executions:
   ?task_id=<task id>), the task list, the task
   changes, the dashboard (the app index), and a few more pages, with django.test.Client in
   this process as a superuser: median of --requests requests after one warm-up. For each page:
   its SQL statements, whether one is a COUNT(*) over the whole scheduler_execution table, and
   its slowest statements with their times (from one more request, captured).
4. REST: GET executions/?limit=50, its following pages through next_cursor (--pages), by
   task_id (a task with many executions, one with a few hundred, one with a handful) and by
   status=unknown: median server time per page; and a few more lists.
5. Retention: one turn of scheduler_app.retention.prune_journal (JOURNAL_RETENTION_DAYS
   --retention-days, a budget of --budget seconds) on the filled journal: executions deleted per
   second (each with its events and log row).

The targets (issue #17): an idle tick stays one statement and about as fast as on the empty
journal; W1 within 10 % of its empty-journal figure; each admin page under 300 ms; each REST page
under 100 ms.

Run (from the repository root; at full size about 10 minutes of generation and 15 of
measurements, and 10 GB of disk under the temporary directory):

    .venv/bin/python bench/scale.py [--tasks 100000] [--executions 5000000] [--recent 0.05] [--w1-tasks 1000]
                                    [--repeat 2]
                                    [--shared-buffers 1GB] [--setting wal_compression=lz4 ...]

A quick check: --tasks 2000 --executions 50000 --w1-tasks 100 --repeat 1 --requests 2.

Writes bench/results/scale.json.
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from _common import (
    DatabaseInfo,
    Processes,
    bench_database,
    pg_conninfo,
    pg_stat_statements_ready,
    private_postgres,
    summary,
    wait_until,
    write_results,
)
from idle_tick import measure as measure_ticks
from noop_hook import read_side_effects
from w1_burst import add_tasks as add_w1_tasks

PORT = 5590
STATS_SETTLE_SECONDS = 11
EMPTY, FILLED = "bench_scale_empty", "bench_scale_filled"
CRON = "0 0 1 1 *"
LEAD_SECONDS = 40
W1_PREFIX = "w1-"
ADMIN_TARGET_MS = 300.0
REST_TARGET_MS = 100.0
W1_TOLERANCE = 0.10
USERNAME = "scale-admin"


def task_id(i: int) -> str:
    return f"scale-{i:06d}"


# -- databases -------------------------------------------------------------------


def pg_admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(pg_conninfo() + " dbname=postgres", autocommit=True) as conn:
        conn.execute(sql)


def use(name: str) -> None:
    """Point this process's Django connections at database ``name`` (of the same cluster)."""
    from django.conf import settings
    from django.contrib.contenttypes.models import ContentType
    from django.db import connections

    connections.close_all()
    settings.DATABASES["default"]["NAME"] = name  # the dict every connection reads at connect
    ContentType.objects.clear_cache()


@contextmanager
def second_database(first: DatabaseInfo, name: str) -> Iterator[DatabaseInfo]:
    """Database ``name`` beside the one bench_database made, migrated; dropped on exit."""
    from django.core.management import call_command

    pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    pg_admin(f'CREATE DATABASE "{name}"')
    try:
        use(name)
        call_command("migrate", verbosity=0)
        yield DatabaseInfo(first.backend, name, {**first.env, "SCHEDULER_DB_NAME": name})
    finally:
        use(first.name)
        pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def tables() -> dict[str, str]:
    from django.db import connection

    from scheduler_app.models import Execution, ExecutionEvent, ExecutionLog, Task, TaskChange

    return {
        key: connection.ops.quote_name(model._meta.db_table)
        for key, model in (
            ("task", Task),
            ("change", TaskChange),
            ("execution", Execution),
            ("event", ExecutionEvent),
            ("log", ExecutionLog),
        )
    }


def add_tasks(count: int) -> float:
    """``count`` tasks none of which is due for weeks, and their creation in the audit trail."""
    from django.contrib.auth import get_user_model
    from django.db import connection

    from scheduler_app.cron import next_fire_time

    t = tables()
    began = time.perf_counter()
    next_run = next_fire_time(CRON, "", datetime.now(UTC))
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {t['task']} (id, name, description, cron, timezone, jitter_seconds, enabled,"
            " delete_after_run, idempotent, retry_max_attempts, retry_backoff, params, handler,"
            " max_concurrency, overlap, misfire_grace_seconds, misfire_policy, declared_in,"
            " disabled_reason, disabled_by, revision, next_run_at, created_at, updated_at)"
            " SELECT 'scale-' || lpad(i::text, 6, '0'), 'Scale ' || i, '', %s, '', 0, i %% 20 <> 0,"
            " false, false, 1, '[]', '{}', NULL, 1, 'skip', NULL, 'coalesce', '', '', '', 1, %s,"
            " now() - interval '90 days', now() - interval '90 days' FROM generate_series(1, %s) AS i",
            [CRON, next_run, count],
        )
        cursor.execute(
            f"INSERT INTO {t['change']} (task_id, at, action, via, by, revision, changes)"
            " SELECT 'scale-' || lpad(i::text, 6, '0'), now() - interval '90 days', 'create', 'api',"
            " 'scale', 1, '{}' FROM generate_series(1, %s) AS i",
            [count],
        )
        for table in (t["task"], t["change"]):
            cursor.execute(f"VACUUM ANALYZE {table}")
    get_user_model().objects.create_superuser(USERNAME, "scale@example.com", "not-a-secret")
    return time.perf_counter() - began


@contextmanager
def bulk_load(keep_primary_keys: tuple[str, ...]) -> Iterator[dict[str, float]]:
    """Drop the journal tables' secondary indexes and unique constraints (and the log table's
    primary key: random uuids) for the load, build them again after it; more WAL room meanwhile."""
    from django.db import connection

    t = tables()
    journal = [t["execution"], t["event"], t["log"]]
    timings: dict[str, float] = {}
    with connection.cursor() as cursor:
        cursor.execute("ALTER SYSTEM SET max_wal_size = '32GB'")
        cursor.execute("ALTER SYSTEM SET checkpoint_timeout = '1h'")
        cursor.execute("SELECT pg_reload_conf()")
        cursor.execute(
            "SELECT i.indrelid::regclass::text, ci.relname, pg_get_indexdef(i.indexrelid),"
            " c.conname, pg_get_constraintdef(c.oid), c.contype"
            " FROM pg_index i JOIN pg_class ci ON ci.oid = i.indexrelid"
            " LEFT JOIN pg_constraint c ON c.conindid = i.indexrelid AND c.conrelid = i.indrelid"
            " WHERE i.indrelid::regclass::text = ANY(%s)",
            [[name.strip('"') for name in journal]],
        )
        rebuild: list[str] = []
        for table, index, index_def, constraint, constraint_def, kind in cursor.fetchall():
            quoted = connection.ops.quote_name(table)
            if kind == "p" and quoted in keep_primary_keys:
                continue
            if constraint:
                cursor.execute(
                    f"ALTER TABLE {quoted} DROP CONSTRAINT {connection.ops.quote_name(constraint)}"
                )
                rebuild.append(
                    f"ALTER TABLE {quoted} ADD CONSTRAINT {connection.ops.quote_name(constraint)} {constraint_def}"
                )
            else:
                cursor.execute(f"DROP INDEX {connection.ops.quote_name(index)}")
                rebuild.append(index_def)
    try:
        yield timings
    finally:
        with connection.cursor() as cursor:
            began = time.perf_counter()
            cursor.execute("SET maintenance_work_mem = '1GB'")
            cursor.execute("SET max_parallel_maintenance_workers = 2")
            for statement in rebuild:
                cursor.execute(statement)
            timings["indexes"] = time.perf_counter() - began
            began = time.perf_counter()
            for table in journal:
                cursor.execute(f"VACUUM (ANALYZE) {table}")
            timings["vacuum_analyze"] = time.perf_counter() - began


def checkpoint() -> float:
    """Put the server's WAL settings back (bulk_load raised them) and checkpoint; its seconds."""
    from django.db import connection

    began = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("ALTER SYSTEM RESET max_wal_size")
        cursor.execute("ALTER SYSTEM RESET checkpoint_timeout")
        cursor.execute("SELECT pg_reload_conf()")
        cursor.execute("CHECKPOINT")
    return time.perf_counter() - began


def fill_journal(executions: int, tasks: int, days: int, events: int, recent: float) -> dict[str, Any]:
    """The filled database's journal: executions, their events and log rows; seconds per step.

    The oldest rows are loaded without the secondary indexes, which are then built, and the tables
    vacuumed; the most recent ``recent`` of the executions (with their events and logs) are then
    inserted with every index in place, as rows written since autovacuum's last turn (PostgreSQL
    vacuums an insert-only table after it grew by a fifth). Those inserts also use up the small gaps
    that the vacuum recorded in the pages of the event table, as a running journal's inserts do:
    just after a vacuum (--recent 0), each new event row goes to a different old page."""
    from django.db import connection

    t = tables()
    began = time.perf_counter()
    seconds: dict[str, float] = {}
    older = executions - round(executions * recent)
    with bulk_load((t["execution"], t["event"])) as rebuilt:
        seconds.update(insert_history(1, older, executions, tasks, days, events))
    seconds.update(rebuilt)
    if older < executions:
        step = time.perf_counter()
        insert_history(older + 1, executions, executions, tasks, days, events)
        seconds["recent"] = time.perf_counter() - step
    seconds["checkpoint"] = checkpoint()
    seconds["total"] = time.perf_counter() - began
    with connection.cursor() as cursor:
        counts = {}
        for key in ("execution", "event", "log"):
            cursor.execute(f"SELECT count(*) FROM {t[key]}")
            counts[key] = cursor.fetchone()[0]
        cursor.execute(f"SELECT status, count(*) FROM {t['execution']} GROUP BY status ORDER BY 2 DESC")
        statuses = dict(cursor.fetchall())
        cursor.execute("SELECT pg_database_size(current_database())")
        size = cursor.fetchone()[0]
    return {
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "rows": counts,
        "statuses": statuses,
        "database_gb": round(size / 1e9, 2),
    }


def insert_history(
    first: int, last: int, executions: int, tasks: int, days: int, events: int
) -> dict[str, float]:
    """Executions ``first`` to ``last`` of the journal's ``executions`` (the n-th ended at
    (now - days) + n * (days / executions)), with their events and log rows; seconds per step."""
    from django.db import connection

    from scheduler_app.models import log_id

    t = tables()
    seconds: dict[str, float] = {}
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT coalesce(max(sequence), 0) FROM {t['execution']}")
        boundary = cursor.fetchone()[0]
        step = time.perf_counter()
        # n-th execution: ended at (now - days) + n * (days / executions); its task from a
        # golden-ratio sequence, squared: the first tasks have thousands, the last a handful.
        cursor.execute(
            f"INSERT INTO {t['execution']} (occurrence_id, task_id, task_revision, trigger_type,"
            " trigger_source, idempotency_key, payload_hash, scheduled_for, due_at, params, status,"
            " attempt, max_attempts, owner, execution_token, lease_expires_at, stop_requested, result,"
            " error, handler_ref, created_at, started_at, finished_at, updated_at, log_persistence)"
            # Occurrence ids shaped as the app's (models.scheduled_occurrence_id, a keyless trigger's
            # uuid7): the milliseconds of the fire time or creation first, then hashed bits.
            " SELECT (lpad(to_hex((extract(epoch FROM due) * 1000)::bigint), 12, '0')"
            "  || '7' || substr(md5('scale|' || n), 14))::uuid,"
            " 'scale-' || lpad(k::text, 6, '0'), 1, trigger,"
            " CASE WHEN trigger = 'manual' THEN 'admin' ELSE '' END, NULL, '',"
            " CASE WHEN trigger = 'scheduled' THEN due END, due, '{}', status, 1, 1,"
            " 'scale-runner-' || (n %% 4), '', NULL, false, NULL,"
            ' CASE status WHEN \'failed\' THEN \'{"reason": "exception", "message": "ValueError: boom"}\'::jsonb'
            '  WHEN \'interrupted\' THEN \'{"reason": "stop requested", "message": "stop requested"}\'::jsonb'
            '  WHEN \'discarded\' THEN \'{"reason": "resolved", "message": "resolved by an operator"}\'::jsonb'
            '  WHEN \'unknown\' THEN \'{"reason": "lease expired", "message": "lease expired while running;'
            " outcome unknown\"}'::jsonb END,"
            " '', due, due + interval '20 milliseconds', due + interval '1 second',"
            " due + interval '1 second', 'persisted'"
            " FROM (SELECT n, 1 + floor(%s * power(n * 0.6180339887498949 - floor(n * 0.6180339887498949), 2))::int AS k,"
            "   now() - make_interval(days => %s) + n * (make_interval(days => %s) / %s) AS due,"
            "   CASE WHEN n %% 50 = 0 THEN 'manual' ELSE 'scheduled' END AS trigger,"
            "   CASE WHEN n %% 16000 = 7 THEN 'unknown' WHEN n %% 100 < 3 THEN 'failed'"
            "    WHEN n %% 200 = 3 THEN 'interrupted' WHEN n %% 1000 = 4 THEN 'discarded'"
            "    ELSE 'success' END AS status"
            "  FROM generate_series(%s, %s) AS n) AS s",
            [tasks, days, days, executions, first, last],
        )
        seconds["executions"] = time.perf_counter() - step
        step = time.perf_counter()
        # Those of a run: created (pending), claimed, started (running), ended; the last ``events``.
        cursor.execute(
            f"INSERT INTO {t['event']} (execution_id, at, from_status, to_status, reason, node, attempt,"
            " result, error)"
            " SELECT e.sequence, e.created_at + m.after, m.f, coalesce(m.t, e.status),"
            " coalesce(m.r, CASE e.status WHEN 'success' THEN 'succeeded' WHEN 'failed' THEN 'exception:"
            " ValueError: boom' ELSE e.error ->> 'message' END),"
            " CASE WHEN m.k = 1 THEN '' ELSE e.owner END, CASE WHEN m.k = 1 THEN 0 ELSE 1 END,"
            " NULL, CASE WHEN m.k = 4 THEN e.error END"
            f" FROM {t['execution']} e CROSS JOIN (VALUES"
            "  (1, '', 'pending', 'scheduled', interval '0'),"
            "  (2, 'pending', 'claimed', 'claimed', interval '10 milliseconds'),"
            "  (3, 'claimed', 'running', 'started', interval '20 milliseconds'),"
            "  (4, 'running', NULL, NULL, interval '1 second')) AS m(k, f, t, r, after)"
            " WHERE e.sequence > %s AND m.k > 4 - %s",
            [boundary, events],
        )
        seconds["events"] = time.perf_counter() - step
        step = time.perf_counter()
        # Log ids as the app makes them (models.log_id: the first 48 bits of the occurrence id, version
        # 7, the other bits those of uuid5 of the occurrence and the attempt), so that retention and
        # repair find the rows by their ids.
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pgcrypto")
        cursor.execute(
            "CREATE OR REPLACE FUNCTION pg_temp.uuid5(namespace uuid, name text) RETURNS uuid LANGUAGE sql IMMUTABLE AS"
            " 'SELECT encode(set_byte(set_byte(h, 6, (get_byte(h, 6) & 15) | 80), 8, (get_byte(h, 8) & 63) | 128),"
            " ''hex'')::uuid FROM (SELECT substring(digest(uuid_send(namespace) || convert_to(name, ''UTF8''),"
            " ''sha1'') FROM 1 FOR 16) AS h) AS d'"
        )
        cursor.execute(
            "CREATE OR REPLACE FUNCTION pg_temp.log_id(occurrence uuid, attempt int)"
            " RETURNS uuid LANGUAGE sql IMMUTABLE AS"
            " 'SELECT (left(replace(occurrence::text, ''-'', ''''), 12) || ''7''"
            " || substr(replace(pg_temp.uuid5(occurrence, attempt::text)::text, ''-'', ''''), 14))::uuid'"
        )
        cursor.execute(
            f"INSERT INTO {t['log']} (id, occurrence_id, task_id, task_name, trigger_type, trigger_source,"
            " status, result, error, attempt, started_at, finished_at, duration_ms)"
            " SELECT pg_temp.log_id(occurrence_id, attempt), occurrence_id, task_id,"
            " 'Scale ' || ltrim(substr(task_id, 7), '0'), trigger_type, trigger_source, status, result,"
            f" error, attempt, started_at, finished_at, 980 FROM {t['execution']} WHERE sequence > %s",
            [boundary],
        )
        seconds["logs"] = time.perf_counter() - step
        cursor.execute(
            f"SELECT pg_temp.log_id(occurrence_id, attempt), occurrence_id, attempt"
            f" FROM {t['execution']} WHERE sequence = %s",
            [boundary + 1],
        )
        made, occurrence, attempt = cursor.fetchone()
        if made != log_id(occurrence, attempt):
            raise SystemExit(f"log ids differ from the app's: {made} for {occurrence}, attempt {attempt}")
    return seconds


# -- 1. idle tick ------------------------------------------------------------------


def idle_tick(ticks: int) -> dict[str, Any]:
    figures = measure_ticks(ticks)
    return {
        "queries_per_tick": figures["queries_per_tick"],
        "tick_ms": figures["tick_ms"],
        "probe_plan": figures["probe_plan"],
    }


# -- 2. W1 ---------------------------------------------------------------------------


def w1_pass(args: argparse.Namespace, db: DatabaseInfo, number: int) -> dict[str, Any]:
    from django.db import connection

    from scheduler_app.models import Execution, ExecutionEvent, Runner

    use(db.name)
    t = tables()
    with ExitStack() as stack:
        folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="scale-effects-"))
        procs = stack.enter_context(Processes())
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT coalesce(max(sequence), 0) FROM {t['execution']}")
            last_sequence = cursor.fetchone()[0]
        names = [f"scale-{number}-{k}" for k in range(2)]
        started = time.time()
        runners = [procs.start_runner(db, name, env={"BENCH_SIDE_EFFECTS": folder}) for name in names]
        live = Runner.objects.filter(node_id__in=names, stopped_at=None)
        if not wait_until(lambda: live.count() == 2, 120):
            raise SystemExit("runners did not start:\n" + runners[0].log_tail())
        startup = time.time() - started
        fire_at = (datetime.now(UTC) + timedelta(seconds=LEAD_SECONDS + 60)).replace(second=0, microsecond=0)
        add_w1_tasks(args.w1_tasks, fire_at)
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {t['task']}")
        statements = pg_stat_statements_ready()
        wait_until(lambda: time.time() >= fire_at.timestamp() - 2, LEAD_SECONDS + 60, 0.2)
        if statements:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_stat_statements_reset()")
        io_before = io_counters()
        indexes_before = index_blocks()
        wal_start = wal_position()
        done = wait_until(lambda: len(read_side_effects(folder)) >= args.w1_tasks, args.timeout, 0.2)
        ours = Execution.objects.filter(sequence__gt=last_sequence)
        wait_until(lambda: not ours.filter(status__in=["pending", "claimed", "running"]).exists(), 30, 0.2)
        lines = read_side_effects(folder)
        # A busy backend reports its counters at most once a second, an idle one within 10 s.
        time.sleep(STATS_SETTLE_SECONDS)
        io = {name: value - io_before[name] for name, value in io_counters().items()}
        io["indexes"] = busiest_indexes(indexes_before, index_blocks())
        io["wal_by_relation"] = wal_by_relation(wal_start, wal_position())
        top = top_statements() if statements else []
        exit_codes = list(procs.stop_all().values())
        sample = ours.order_by("sequence").first()
        events = (
            list(
                ExecutionEvent.objects.filter(execution_id=sample.sequence).values_list(
                    "from_status", "to_status", "reason", "attempt"
                )
            )
            if sample
            else []
        )
        latency = [at - fire_at.timestamp() for _, at, _ in lines]
        per_occurrence = Counter(occurrence for _, _, occurrence in lines)
        with connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {t['event']} WHERE execution_id > %s", [last_sequence])
            cursor.execute(
                f"DELETE FROM {t['log']} WHERE finished_at >= %s AND task_id LIKE %s",
                [datetime.fromtimestamp(started, UTC), W1_PREFIX + "%"],
            )
            cursor.execute(f"DELETE FROM {t['execution']} WHERE sequence > %s", [last_sequence])
            cursor.execute(f"DELETE FROM {t['task']} WHERE id LIKE %s", [W1_PREFIX + "%"])
        Runner.objects.filter(node_id__in=names).delete()
        return {
            "database": "filled" if db.name == FILLED else "empty",
            "runner_startup_s": round(startup, 1),
            "all_ran": done,
            "side_effects": len(lines),
            "duplicates": sum(c - 1 for c in per_occurrence.values() if c > 1),
            "due_to_start_latency_s": summary(latency, 3),
            "runner_exit_codes": exit_codes,
            "sample_events": events,
            "top_statements": top,
            "io": io,
        }


def io_counters() -> dict[str, int]:
    """This database's blocks read from outside shared buffers and found in them, and the
    cluster's WAL (full-page images, bytes): a burst's writes to index pages the buffers do not
    hold show as reads and, after a checkpoint, as full-page images."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT blks_read, blks_hit, (SELECT wal_fpi FROM pg_stat_wal), (SELECT wal_bytes FROM pg_stat_wal)"
            " FROM pg_stat_database WHERE datname = current_database()"
        )
        read, hit, fpi, wal = cursor.fetchone()
    return {"blocks_read": read, "blocks_hit": hit, "wal_fpi": fpi, "wal_bytes": int(wal)}


def wal_position() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_insert_lsn()::text")
        return str(cursor.fetchone()[0])


BLOCK_REFERENCE = re.compile(r"rel \d+/(\d+)/(\d+) fork (\w+) blk (\d+)( \(FPW\))?")


def wal_by_relation(start: str, end: str, limit: int = 8) -> list[dict[str, Any]]:
    """The relations of this database whose pages the WAL between two positions wrote most
    full-page images of (pg_walinspect): each one's full-page images and the distinct pages its
    records changed. [] when pg_walinspect cannot be installed."""
    from django.db import DatabaseError, connection, transaction

    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    except DatabaseError:
        return []
    with connection.cursor() as cursor:
        cursor.execute("SELECT oid FROM pg_database WHERE datname = current_database()")
        database = str(cursor.fetchone()[0])
        cursor.execute("SELECT relfilenode::text, relname FROM pg_class WHERE relfilenode <> 0")
        names = dict(cursor.fetchall())
        cursor.execute(
            "SELECT block_ref FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn) WHERE block_ref IS NOT NULL",
            [start, end],
        )
        references = [row[0] for row in cursor.fetchall()]
    images: Counter[str] = Counter()
    pages: dict[str, set[tuple[str, int]]] = {}
    for reference in references:
        for db_oid, node, fork, block, image in BLOCK_REFERENCE.findall(reference):
            if db_oid != database:
                continue
            name = names.get(node, node)
            pages.setdefault(name, set()).add((fork, int(block)))
            if image:
                images[name] += 1
    rows = [{"relation": name, "fpi": images[name], "pages": len(seen)} for name, seen in pages.items()]
    rows.sort(key=lambda row: (row["fpi"], row["pages"]), reverse=True)
    return rows[:limit]


def index_blocks() -> dict[str, tuple[int, int]]:
    """Blocks each index of this database read from outside shared buffers and found in them."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT indexrelname, idx_blks_read, idx_blks_hit FROM pg_statio_user_indexes")
        return {name: (read, hit) for name, read, hit in cursor.fetchall()}


def busiest_indexes(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]], limit: int = 8
) -> list[dict[str, Any]]:
    """The indexes that read the most blocks from outside shared buffers between two readings."""
    rows = [
        {"index": name, "read": read - before.get(name, (0, 0))[0], "hit": hit - before.get(name, (0, 0))[1]}
        for name, (read, hit) in after.items()
    ]
    rows.sort(key=lambda row: (row["read"], row["hit"]), reverse=True)
    return [row for row in rows[:limit] if row["read"] or row["hit"]]


def top_statements(limit: int = 8) -> list[dict[str, Any]]:
    """The statements of this database that took the most time since the last reset (the burst)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT calls, round(total_exec_time::numeric, 1), round(mean_exec_time::numeric, 3), query"
            " FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND query NOT LIKE '%%pg_stat%%' ORDER BY total_exec_time DESC LIMIT %s",
            [limit],
        )
        return [
            {"calls": calls, "total_ms": float(total), "mean_ms": float(mean), "sql": sql[:600]}
            for calls, total, mean, sql in cursor.fetchall()
        ]


# -- 3 and 4. pages -------------------------------------------------------------------

WHOLE_COUNT = re.compile(r'\s*SELECT COUNT\(\*\)(?: AS "__count")? FROM "(\w+)"\s*$', re.I)


def explain(sql: str) -> list[str]:
    """The plan of one captured SELECT as it runs now (EXPLAIN ANALYZE); [] when it cannot be run again."""
    from django.db import DatabaseError, connection, transaction

    if not sql.lstrip().upper().startswith("SELECT"):
        return []
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql)
            return [row[0] for row in cursor.fetchall()]
    except DatabaseError as exc:
        return [f"(not explained: {exc})"]


def page_figures(client: Any, url: str, requests: int) -> dict[str, Any]:
    """Median server milliseconds of ``url`` over ``requests`` after a warm-up; its statements."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    response = client.get(url)
    millis = []
    for _ in range(requests):
        began = time.perf_counter()
        response = client.get(url)
        millis.append((time.perf_counter() - began) * 1000)
    with CaptureQueriesContext(connection) as captured:
        client.get(url)
    queries = [(float(q["time"]) * 1000, q["sql"]) for q in captured.captured_queries]
    counts = [sql for _, sql in queries if re.match(r"\s*SELECT COUNT\(", sql, re.I)]
    return {
        "url": url,
        "status_code": response.status_code,
        "median_ms": round(statistics.median(millis), 1),
        "all_ms": [round(m, 1) for m in millis],
        "queries": len(queries),
        "queries_ms": round(sum(ms for ms, _ in queries), 1),
        "whole_table_counts": [m.group(1) for m in map(WHOLE_COUNT.match, counts) if m],
        "counts": [sql[:300] for sql in counts],
        "slowest": [
            {"ms": round(ms, 1), "sql": sql[:1500], "sql_full": sql}
            for ms, sql in sorted(queries, reverse=True)[:3]
        ],
        "response": response,
    }


def pages(requests: int, rest_pages: int, plans: bool) -> dict[str, dict[str, Any]]:
    """Every page's figures; with ``plans``, the plan of the slowest statement of a page over its target."""
    out = _pages(requests, rest_pages)
    if plans:
        for page in out.values():
            if page["median_ms"] > page["target_ms"] and page["slowest"]:
                page["slowest_plan"] = explain(page["slowest"][0]["sql_full"])
    for page in out.values():
        for q in page["slowest"]:
            q.pop("sql_full", None)
    return out


def _pages(requests: int, rest_pages: int) -> dict[str, dict[str, Any]]:
    from django.contrib.auth import get_user_model
    from django.test import Client

    from scheduler_app.models import Execution

    client = Client()
    client.force_login(get_user_model().objects.get(username=USERNAME))
    one = (
        Execution.objects.filter(task_id=task_id(123))
        .order_by("-sequence")
        .values_list("sequence", flat=True)
        .first()
    )
    admin = "/admin/scheduler_app/"
    api = "/api/scheduler/"
    out: dict[str, dict[str, Any]] = {}
    listed = [
        ("admin: executions", f"{admin}execution/", ADMIN_TARGET_MS),
        ("admin: executions ?status=unknown", f"{admin}execution/?status=unknown", ADMIN_TARGET_MS),
        (
            f"admin: executions ?task_id={task_id(123)}",
            f"{admin}execution/?task_id={task_id(123)}",
            ADMIN_TARGET_MS,
        ),
        ("admin: tasks ?health=failing", f"{admin}task/?health=failing", ADMIN_TARGET_MS),
        ("admin: tasks", f"{admin}task/", ADMIN_TARGET_MS),
        ("admin: dashboard (app index)", admin, ADMIN_TARGET_MS),
        ("admin: task changes", f"{admin}taskchange/", ADMIN_TARGET_MS),
        ("admin: tasks ?last_outcome=failed", f"{admin}task/?last_outcome=failed", ADMIN_TARGET_MS),
        ("admin: logs", f"{admin}executionlog/", ADMIN_TARGET_MS),
        (
            f"admin: logs ?task_id={task_id(123)}",
            f"{admin}executionlog/?task_id={task_id(123)}",
            ADMIN_TARGET_MS,
        ),
        (f"admin: task {task_id(123)}", f"{admin}task/{task_id(123)}/change/", ADMIN_TARGET_MS),
    ]
    if one:
        listed.append(
            (f"admin: an execution of {task_id(123)}", f"{admin}execution/{one}/change/", ADMIN_TARGET_MS)
        )
    for name, url, target in listed:
        figures = page_figures(client, url, requests)
        figures.pop("response")
        out[name] = {**figures, "target_ms": target}
    # REST: the first page, then the next ones through next_cursor.
    rest = [
        ("REST: executions", f"{api}executions/?limit=50"),
        (f"REST: executions ?task_id={task_id(1)}", f"{api}executions/?limit=50&task_id={task_id(1)}"),
        (f"REST: executions ?task_id={task_id(123)}", f"{api}executions/?limit=50&task_id={task_id(123)}"),
        (
            f"REST: executions ?task_id={task_id(90000)}",
            f"{api}executions/?limit=50&task_id={task_id(90000)}",
        ),
        ("REST: executions ?status=unknown", f"{api}executions/?limit=50&status=unknown"),
    ]
    for name, url in rest:
        first = page_figures(client, url, requests)
        response = first.pop("response")
        out[name + " (page 1)"] = {**first, "target_ms": REST_TARGET_MS}
        following = []
        for _ in range(rest_pages - 1):
            cursor = response.json().get("next_cursor") if response.status_code == 200 else None
            if not cursor:
                break
            figures = page_figures(client, f"{url}&cursor={cursor}", requests)
            response = figures.pop("response")
            following.append(figures)
        if following:
            slowest = max(following, key=lambda f: f["median_ms"])
            out[name + f" (pages 2-{len(following) + 1})"] = {
                **slowest,
                "url": url + "&cursor=...",
                "median_ms": round(statistics.median(f["median_ms"] for f in following), 1),
                "max_page_ms": slowest["median_ms"],
                "target_ms": REST_TARGET_MS,
            }
    for name, url in [
        ("REST: executions/unknown/", f"{api}executions/unknown/"),
        ("REST: logs", f"{api}logs/"),
        (f"REST: logs ?task_id={task_id(123)}", f"{api}logs/?task_id={task_id(123)}"),
        ("REST: tasks", f"{api}tasks/"),
    ]:
        figures = page_figures(client, url, requests)
        figures.pop("response")
        out[name] = {**figures, "target_ms": REST_TARGET_MS}
    return out


# -- 5. retention ------------------------------------------------------------------------


def retention_turn(days: int, budget: float) -> dict[str, Any]:
    from django.conf import settings
    from django.test import override_settings

    from scheduler_app import retention
    from scheduler_app.models import Execution

    older = Execution.objects.filter(finished_at__lt=datetime.now(UTC) - timedelta(days=days)).count()
    with override_settings(SCHEDULER_APP={**settings.SCHEDULER_APP, "JOURNAL_RETENTION_DAYS": days}):
        pruned = retention.prune_journal(datetime.now(UTC), budget_seconds=budget)
    return {
        "older_than_retention": older,
        "executions": pruned.executions,
        "events": pruned.events,
        "logs": pruned.logs,
        "seconds": pruned.seconds,
        "executions_per_second": round(pruned.executions / pruned.seconds, 1) if pruned.seconds else None,
    }


# -- the table ------------------------------------------------------------------------------


def ratio(value: float | None, base: float | None) -> str:
    if value is None or not base:
        return "-"
    return f"{value / base:.2f}x"


def table(results: dict[str, Any]) -> None:
    rows: list[tuple[str, str, str, str, str, str]] = []
    gen = results["generation"]
    idle = results["idle_tick"]
    for key, label in (("queries_per_tick", "statements"), ("tick_ms", "ms")):
        figure, base = idle["filled"][key]["p50"], idle["empty"][key]["p50"]
        if key == "queries_per_tick":
            figure, base = idle["filled"][key]["mean"], idle["empty"][key]["mean"]
            ok = "ok" if figure <= 1.0 else "OVER"
            target = "1"
        else:
            ok = "ok" if figure <= base * 1.25 + 0.2 else "OVER"
            target = "~ empty"
        rows.append(
            (
                f"idle tick: {label} per tick (p50{'/mean' if key == 'queries_per_tick' else ''})",
                f"{figure}",
                f"{base}",
                ratio(figure, base),
                target,
                ok,
            )
        )
    w1 = results["w1"]
    for p in ("p50", "p99"):
        figure, base = w1["filled_median"][p], w1["empty_median"][p]
        ok = "ok" if figure is not None and base and figure <= base * (1 + W1_TOLERANCE) else "OVER"
        rows.append(
            (
                f"W1 {results['args']['w1_tasks']} tasks: due-to-start {p} s",
                f"{figure}",
                f"{base}",
                ratio(figure, base),
                "within 10 %",
                ok,
            )
        )
    rows.append(
        (
            "W1: duplicates (all passes)",
            str(w1["filled_duplicates"]),
            str(w1["empty_duplicates"]),
            "-",
            "0",
            "ok" if w1["filled_duplicates"] == w1["empty_duplicates"] == 0 else "OVER",
        )
    )
    for name, page in results["pages"]["filled"].items():
        base = results["pages"]["empty"].get(name, {}).get("median_ms")
        figure = page["median_ms"]
        shown_base = "-" if base is None else f"{base}"
        ok = "ok" if page["status_code"] == 200 and figure <= page["target_ms"] else "OVER"
        note = "" if page["status_code"] == 200 else f" [HTTP {page['status_code']}]"
        whole = [
            name.removeprefix("scheduler_app_")
            for name in page["whole_table_counts"]
            if name.startswith("scheduler_app_")
        ]
        count = f" [COUNT(*) of all {', '.join(whole)}]" if whole else ""
        rows.append(
            (
                f"{name} ms{note}{count} ({page['queries']} q)",
                f"{figure}",
                shown_base,
                ratio(figure, base),
                f"< {page['target_ms']:.0f} ms",
                ok,
            )
        )
    r = results["retention"]
    rows.append(
        (
            f"retention: executions deleted/s ({r['executions']:,} in {r['seconds']} s)",
            f"{r['executions_per_second']}",
            "-",
            "-",
            "-",
            "",
        )
    )
    rows.append(
        (
            f"data generation s ({results['args']['executions']:,} executions)",
            f"{gen['seconds']['total']}",
            "-",
            "-",
            "-",
            "",
        )
    )
    widths = [
        max(len(row[i]) for row in [*rows, ("figure", "filled", "empty", "ratio", "target", "")])
        for i in range(6)
    ]
    header = ("figure", "filled", "empty", "ratio", "target", "")
    print()
    for row in [header, *rows]:
        print(
            "  ".join(
                cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row)
            )
        )


def print_slow(results: dict[str, Any]) -> None:
    print("\nslowest statements of each page over its target (filled journal):")
    for name, page in results["pages"]["filled"].items():
        if page["status_code"] == 200 and page["median_ms"] <= page["target_ms"]:
            continue
        print(
            f"- {name}: {page['median_ms']} ms, {page['queries']} statements, {page['queries_ms']} ms in SQL"
        )
        for q in page["slowest"][:2]:
            print(f"    {q['ms']} ms: {q['sql'][:400]}")
        for line in page.get("slowest_plan", [])[:25]:
            print(f"      | {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--executions", type=int, default=5_000_000)
    parser.add_argument("--events", type=int, default=4, choices=[2, 3, 4], help="events per execution")
    parser.add_argument(
        "--days", type=int, default=60, help="the journal's executions ended over these last days"
    )
    parser.add_argument(
        "--recent",
        type=float,
        default=0.05,
        help="the share of the executions inserted after the vacuum, with the indexes in place (0: none)",
    )
    parser.add_argument("--w1-tasks", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=2, help="W1 passes on each database, alternating")
    parser.add_argument("--ticks", type=int, default=200)
    parser.add_argument("--requests", type=int, default=5, help="timed requests per page (after a warm-up)")
    parser.add_argument("--pages", type=int, default=5, help="REST pages followed through next_cursor")
    parser.add_argument("--retention-days", type=int, default=30)
    parser.add_argument(
        "--budget", type=float, default=20.0, help="seconds the retention turn may delete for"
    )
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument(
        "--shared-buffers",
        help="the private cluster's shared_buffers (e.g. 1GB); PostgreSQL's default (128MB) when not given",
    )
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="another setting of the private cluster (e.g. wal_compression=lz4); repeatable",
    )
    args = parser.parse_args()
    results: dict[str, Any] = {"args": vars(args)}
    with ExitStack() as stack:
        server = dict(setting.split("=", 1) for setting in args.setting)
        if args.shared_buffers:
            server["shared_buffers"] = args.shared_buffers
        stack.enter_context(private_postgres(PORT, server))
        empty = stack.enter_context(bench_database(EMPTY, settings="bench.settings"))
        results["idle_tick"] = {"no_tasks": idle_tick(args.ticks)}
        seconds = add_tasks(args.tasks)
        print(f"empty: {args.tasks:,} tasks in {seconds:.1f} s")
        filled = stack.enter_context(second_database(empty, FILLED))
        seconds = add_tasks(args.tasks)
        print(f"filled: {args.tasks:,} tasks in {seconds:.1f} s; filling the journal...", flush=True)
        gen = fill_journal(args.executions, args.tasks, args.days, args.events, args.recent)
        gen["seconds"]["tasks"] = round(seconds, 1)
        results["generation"] = gen
        print(
            f"filled: {gen['rows']['execution']:,} executions, {gen['rows']['event']:,} events,"
            f" {gen['rows']['log']:,} log rows in {gen['seconds']['total']} s {gen['seconds']};"
            f" statuses {gen['statuses']}; database {gen['database_gb']} GB",
            flush=True,
        )
        for db in (empty, filled):
            use(db.name)
            key = "filled" if db is filled else "empty"
            results["idle_tick"][key] = idle_tick(args.ticks)
            i = results["idle_tick"][key]
            print(
                f"idle tick, {key}: {i['queries_per_tick']['mean']} statements, p50 {i['tick_ms']['p50']} ms,"
                f" p99 {i['tick_ms']['p99']} ms",
                flush=True,
            )
        passes: list[dict[str, Any]] = []
        for _number in range(args.repeat):
            for db in (empty, filled):
                r = w1_pass(args, db, len(passes))
                passes.append(r)
                lat = r["due_to_start_latency_s"]
                print(
                    f"W1 {r['database']}: {r['side_effects']}/{args.w1_tasks} ran, {r['duplicates']} duplicates,"
                    f" due-to-start p50 {lat.get('p50')} p99 {lat.get('p99')} s; runners up in"
                    f" {r['runner_startup_s']} s",
                    flush=True,
                )
                io = r["io"]
                print(
                    f"    blocks read {io['blocks_read']:,}, hit {io['blocks_hit']:,}; WAL {io['wal_bytes'] / 2**20:.1f} MiB,"
                    f" {io['wal_fpi']:,} full-page images"
                )
                print(
                    "    index blocks read/hit: "
                    + ", ".join(f"{i['index']} {i['read']:,}/{i['hit']:,}" for i in io["indexes"])
                )
                if io["wal_by_relation"]:
                    print(
                        "    full-page images / pages changed: "
                        + ", ".join(
                            f"{w['relation']} {w['fpi']:,}/{w['pages']:,}" for w in io["wal_by_relation"]
                        )
                    )
                for q in r["top_statements"][:6]:
                    print(
                        f"    {q['calls']} calls, {q['total_ms']} ms (mean {q['mean_ms']}): {q['sql'][:160]}"
                    )
        w1: dict[str, Any] = {"passes": passes}
        for key in ("empty", "filled"):
            mine = [p for p in passes if p["database"] == key]
            w1[f"{key}_median"] = {
                p: round(statistics.median(x["due_to_start_latency_s"].get(p) or 0 for x in mine), 3)
                for p in ("p50", "p99")
            }
            w1[f"{key}_duplicates"] = sum(x["duplicates"] for x in mine)
        results["w1"] = w1
        results["pages"] = {}
        for db in (empty, filled):
            use(db.name)
            key = "filled" if db is filled else "empty"
            results["pages"][key] = pages(args.requests, args.pages, plans=db is filled)
            print(f"pages timed on the {key} database", flush=True)
        use(filled.name)
        results["retention"] = retention_turn(args.retention_days, args.budget)
        use(empty.name)
    table(results)
    print_slow(results)
    write_results("scale", results)


if __name__ == "__main__":
    main()
