"""Cost of one idle tick as the number of defined tasks grows.

Measures, in-process, the SQL queries and wall milliseconds of ``SchedulerLoop.tick()``
when no task is due, with 100, 10,000 and 100,000 tasks defined (cron
"0 0 1 1 *", so next_run_at is months away). The design says an idle tick is
one indexed query whatever the number of tasks: queries per tick should stay
at 1 and the time should stay flat.

One SchedulerLoop(inline=True) per size; runner.start() once, a few warm-up ticks
(the first tick also prunes logs), then --ticks measured ticks, each wrapped
in CaptureQueriesContext and timed with perf_counter.

Run (from the repository root):

    .venv/bin/python bench/idle_tick.py [--db postgres|sqlite|mysql] [--ticks 200] [--sizes 100,10000,100000]

Writes bench/results/idle_tick.json. Creates and drops database bench_idle.
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime

from _common import analyze, bench_database, summary, write_results

CRON = "0 0 1 1 *"
WARMUP = 5


def add_tasks(first: int, last: int) -> None:
    """Insert tasks first..last-1 quickly, next_run_at computed here."""
    from scheduler_app.cron import next_fire_time
    from scheduler_app.models import Task

    next_run = next_fire_time(CRON, "", datetime.now(UTC))
    batch = [
        Task(id=f"idle-{i:06d}", name=f"Idle {i}", cron=CRON, timezone="", next_run_at=next_run)
        for i in range(first, last)
    ]
    Task.objects.bulk_create(batch, batch_size=5000)


def measure(ticks: int) -> dict[str, object]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from scheduler_app.db import probe_statement
    from scheduler_app.runner.loop import SchedulerLoop

    runner = SchedulerLoop(node_id="bench", workers=1, inline=True)
    runner.start()
    for _ in range(WARMUP):
        runner.tick()
    counts: list[int] = []
    millis: list[float] = []
    sample_sql: list[str] = []
    for _ in range(ticks):
        with CaptureQueriesContext(connection) as captured:
            start = time.perf_counter()
            runner.tick()
            millis.append((time.perf_counter() - start) * 1000)
        counts.append(len(captured.captured_queries))
        if not sample_sql:
            sample_sql = [q["sql"] for q in captured.captured_queries]
    runner.stop()
    plan: list[str] = []
    if connection.vendor == "postgresql" and len(sample_sql) == 1:
        # The probe, as the planner runs it at this size (the captured text has server-side
        # placeholders, so the statement is built again with its parameters).
        sql, params = probe_statement(connection)
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN " + sql, params)
            plan = [row[0] for row in cursor.fetchall()]
    return {
        "queries_per_tick": summary(counts, 2),
        "tick_ms": summary(millis, 3),
        "sample_tick_sql": sample_sql,
        "probe_plan": plan,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=["postgres", "sqlite", "mysql"], default="postgres")
    parser.add_argument("--ticks", type=int, default=200)
    parser.add_argument("--sizes", default="100,10000,100000", help="comma-separated task counts, ascending")
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))

    results: dict[str, object] = {"db": args.db, "ticks": args.ticks, "warmup_ticks": WARMUP, "sizes": {}}
    with bench_database("bench_idle", args.db):
        from scheduler_app.models import Task

        have = 0
        print(f"idle tick on {args.db}, {args.ticks} ticks per size")
        print(f"{'tasks':>8} {'queries/tick':>13} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
        for size in sizes:
            add_tasks(have, size)
            have = size
            analyze()
            assert Task.objects.count() == size
            figures = measure(args.ticks)
            results["sizes"][str(size)] = figures  # type: ignore[index]
            q, ms = figures["queries_per_tick"], figures["tick_ms"]
            print(f"{size:>8} {q['mean']:>13} {ms['p50']:>8} {ms['p99']:>8} {ms['max']:>8}")  # type: ignore[index]
    write_results("idle_tick" if args.db == "postgres" else f"idle_tick_{args.db}", results)


if __name__ == "__main__":
    main()
