"""A burst: N tasks all due in the same minute, run by K runner processes.

Registers --tasks tasks (bulk_create) whose only fire time of the day is the
minute T, the next minute boundary at least --lead seconds after the runners
start. Starts --runners processes (`run_scheduler --workers W --tick-interval
0.2`) whose hook appends one line per attempt to a side-effect folder, waits
until N lines are written (or --timeout), then stops the runners with SIGTERM.

Reports: seconds from T to the last finished execution (journal finished_at
and side-effect file mtime), executions per second (N / (last finish - first
start)), due-to-start latency (started_at - scheduled_for) p50/p99/max,
duplicates (occurrence ids with more than one side effect; tasks with other
than one execution), executions per runner, peak RSS (VmHWM) per runner,
database transactions (pg_stat_database) and statements (pg_stat_statements,
only when the server preloads it), and whether the runners exited 0.

Run (from the repository root; takes about a minute plus the burst):

    .venv/bin/python bench/burst.py [--tasks 10000] [--runners 2] [--workers 8] [--tick-interval 0.2]
                                    [--lead 40] [--timeout 600] [--db postgres|mysql]

Writes bench/results/burst.json. Creates and drops database bench_burst.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _common import Processes, analyze, bench_database, summary, wait_until, write_results


def next_minute(after: datetime) -> datetime:
    return after.replace(second=0, microsecond=0) + timedelta(minutes=1)


def read_lines(folder: Path) -> list[tuple[str, str, str]]:
    rows = []
    for path in folder.glob("*.log"):
        for line in path.read_text().splitlines():
            parts = line.split(",")
            if len(parts) == 3:  # a line being written may be partial
                rows.append((parts[0], parts[1], parts[2]))
    return rows


def add_tasks(count: int, fire_at: datetime) -> None:
    from scheduler_app.models import Task

    cron = f"{fire_at.minute} {fire_at.hour} * * *"
    Task.objects.bulk_create(
        [
            Task(id=f"burst-{i:06d}", name=f"Burst {i}", cron=cron, timezone="", next_run_at=fire_at)
            for i in range(count)
        ],
        batch_size=5000,
    )


def pg_counters() -> dict[str, Any]:
    """Transactions of this database so far, and statements when pg_stat_statements works."""
    from django.db import DatabaseError, connection, transaction

    if connection.vendor != "postgresql":
        return {}
    out: dict[str, Any] = {}
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted"
            " FROM pg_stat_database WHERE datname = current_database()"
        )
        keys = ("xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted")
        out.update(zip(keys, cursor.fetchone(), strict=True))
        cursor.execute(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_del, seq_scan, idx_scan FROM pg_stat_user_tables"
            " WHERE relname LIKE 'scheduler_app_%%' ORDER BY relname"
        )
        out["tables"] = {
            row[0]: dict(zip(("ins", "upd", "del", "seq_scan", "idx_scan"), row[1:], strict=True))
            for row in cursor
        }
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT coalesce(sum(calls), 0), count(*) FROM pg_stat_statements"
                " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
            out["statements"], out["distinct_statements"] = (int(v) for v in cursor.fetchone())
    except DatabaseError:
        pass
    return out


def enable_pg_stat_statements() -> bool:
    from django.db import DatabaseError, connection, transaction

    if connection.vendor != "postgresql":
        return False
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            cursor.execute("SELECT pg_stat_statements_reset()")
        return True
    except DatabaseError:  # not in shared_preload_libraries
        return False


def delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    keys = ("xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted")
    out = {k: after[k] - before[k] for k in keys if k in before and k in after}
    if "tables" in after:
        out["tables"] = {
            name: {k: v - before.get("tables", {}).get(name, {}).get(k, 0) for k, v in row.items()}
            for name, row in after["tables"].items()
        }
    if "statements" in after:
        out["statements"] = after["statements"] - before.get("statements", 0)
        out["distinct_statements"] = after["distinct_statements"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--runners", type=int, default=2)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--tick-interval", default="0.2")
    parser.add_argument(
        "--lead", type=float, default=40.0, help="seconds between runner start and T, at least"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds after T to give up")
    parser.add_argument("--db", choices=["postgres", "mysql"], default="postgres")
    args = parser.parse_args()
    n = args.tasks
    effects = Path(tempfile.mkdtemp(prefix="bench-burst-effects-"))
    result: dict[str, Any] = {
        "tasks": n,
        "runners": args.runners,
        "workers": args.workers,
        "tick_interval": float(args.tick_interval),
        "db": args.db,
    }
    try:
        with bench_database("bench_burst", args.db) as db, Processes() as procs:
            from django.db.models import Count, Max, Min

            from scheduler_app.models import Execution, Runner, Status

            has_statements = enable_pg_stat_statements()
            fire_at = next_minute(datetime.now(UTC) + timedelta(seconds=args.lead))
            runners = [
                procs.start_runner(
                    db,
                    f"bench-runner-{k}",
                    "--workers",
                    str(args.workers),
                    "--tick-interval",
                    args.tick_interval,
                    env={"SCHEDULER_SIDE_EFFECTS": str(effects)},
                )
                for k in range(args.runners)
            ]
            add_tasks(n, fire_at)
            analyze()
            print(f"{n} tasks due at {fire_at:%H:%M:%S}Z; {args.runners} runners x {args.workers} workers")
            if not wait_until(lambda: Runner.objects.count() == args.runners, 60, 0.5):
                raise SystemExit("runners did not start:\n" + "\n".join(r.log_tail() for r in runners))
            lead = (fire_at - datetime.now(UTC)).total_seconds()
            print(f"runners up; T in {lead:.1f} s")

            def sample() -> None:
                for runner in runners:
                    runner.sample_rss()
                    if runner.popen.poll() is not None:
                        raise SystemExit(
                            f"{runner.name} exited with {runner.popen.returncode}:\n{runner.log_tail()}"
                        )

            wait_until(lambda: datetime.now(UTC) >= fire_at - timedelta(seconds=2), lead, 0.5, sample)
            before = pg_counters()
            if has_statements:
                from django.db import connection

                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_stat_statements_reset()")
                before["statements"] = 0
            deadline = (fire_at - datetime.now(UTC)).total_seconds() + args.timeout
            done = wait_until(lambda: len(read_lines(effects)) >= n, deadline, 0.5, sample)
            print(
                "all side effects written"
                if done
                else f"TIMEOUT: {len(read_lines(effects))} of {n} side effects"
            )
            # The hook writes its line before the runner records the outcome: let the journal catch up.
            terminal = Execution.objects.filter(
                status__in=[Status.SUCCESS, Status.FAILED, Status.INTERRUPTED]
            )
            wait_until(lambda: terminal.count() >= n, 30 if done else 1, 0.5, sample)
            time.sleep(1.0)  # one more tick: anything duplicated right at the end shows up too

            for runner in runners:
                runner.sample_rss()
            exit_codes = {r.name: procs.terminate(r) for r in runners}
            after = pg_counters()

            lines = read_lines(effects)
            per_occurrence = Counter(occurrence for _, occurrence, _ in lines)
            occurrences_per_task: dict[str, set[str]] = {}
            for task_id, occurrence, _ in lines:
                occurrences_per_task.setdefault(task_id, set()).add(occurrence)
            per_task_db = Counter(
                dict(
                    Execution.objects.values("task_id")
                    .annotate(c=Count("sequence"))
                    .values_list("task_id", "c")
                )
            )
            rows = list(
                Execution.objects.values_list("scheduled_for", "created_at", "started_at", "finished_at")
            )
            agg = Execution.objects.aggregate(first_start=Min("started_at"), last_finish=Max("finished_at"))
            last_mtime = max((p.stat().st_mtime for p in effects.glob("*.log")), default=None)
            latency = [(s - d).total_seconds() for d, _, s, _ in rows if s is not None and d is not None]
            span = None
            if agg["first_start"] and agg["last_finish"]:
                span = (agg["last_finish"] - agg["first_start"]).total_seconds()

            result.update(
                {
                    "fire_at": fire_at.isoformat(),
                    "lead_seconds": round(lead, 1),
                    "completed": done,
                    "side_effect_lines": len(lines),
                    "executions": len(rows),
                    "statuses": dict(Counter(Execution.objects.values_list("status", flat=True))),
                    "seconds_T_to_first_start": _secs(agg["first_start"], fire_at),
                    "seconds_T_to_last_finished": _secs(agg["last_finish"], fire_at),
                    "seconds_T_to_last_side_effect_mtime": round(last_mtime - fire_at.timestamp(), 3)
                    if last_mtime
                    else None,
                    "executions_per_second": round(n / span, 1) if span else None,
                    "due_to_start_latency_s": summary(latency),
                    "duplicates": {
                        "occurrences_with_several_side_effects": sum(
                            1 for c in per_occurrence.values() if c > 1
                        ),
                        "extra_side_effect_lines": sum(c - 1 for c in per_occurrence.values() if c > 1),
                        "tasks_with_several_occurrences_run": sum(
                            1 for o in occurrences_per_task.values() if len(o) > 1
                        ),
                        "tasks_without_side_effect": n - len(occurrences_per_task),
                        "tasks_with_executions_not_1": sum(
                            1 for i in range(n) if per_task_db[f"burst-{i:06d}"] != 1
                        ),
                    },
                    "executions_per_runner": dict(Counter(Execution.objects.values_list("owner", flat=True))),
                    "peak_rss_mb": {r.name: round(r.peak_rss_kb / 1024, 1) for r in runners},
                    "exit_codes": exit_codes,
                    "database": delta(before, after),
                }
            )
            if not all(code == 0 for code in exit_codes.values()):
                result["runner_log_tails"] = {r.name: r.log_tail() for r in runners}
    finally:
        shutil.rmtree(effects, ignore_errors=True)
    report(result)
    write_results("burst", result)


def _secs(moment: datetime | None, origin: datetime) -> float | None:
    return None if moment is None else round((moment - origin).total_seconds(), 3)


def report(r: dict[str, Any]) -> None:
    lat, dup, dbs = r.get("due_to_start_latency_s", {}), r.get("duplicates", {}), r.get("database", {})
    print(
        f"burst of {r['tasks']} tasks, {r['runners']} runners x {r['workers']} workers, tick {r['tick_interval']} s"
    )
    print(
        f"  completed:                 {r.get('completed')} ({r.get('side_effect_lines')} side effects, "
        f"{r.get('executions')} executions, statuses {r.get('statuses')})"
    )
    print(
        f"  T -> first start:          {r.get('seconds_T_to_first_start')} s (all occurrences are created first)"
    )
    print(
        f"  T -> last finished:        {r.get('seconds_T_to_last_finished')} s "
        f"(side-effect mtime {r.get('seconds_T_to_last_side_effect_mtime')} s)"
    )
    print(f"  executions per second:     {r.get('executions_per_second')}")
    print(f"  due -> start latency (s):  p50 {lat.get('p50')}  p99 {lat.get('p99')}  max {lat.get('max')}")
    print(f"  duplicates:                {dup}")
    print(f"  executions per runner:     {r.get('executions_per_runner')}")
    print(f"  peak RSS (MB):             {r.get('peak_rss_mb')}")
    print(
        f"  database:                  {dbs}"
        + ("" if "statements" in dbs else "  (pg_stat_statements not loaded)")
    )
    print(f"  runner exit codes:         {r.get('exit_codes')}")


if __name__ == "__main__":
    main()
