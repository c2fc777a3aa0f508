"""IDLE: statements per second sent by K idle runner processes, with 0, 1,000 and 100,000 tasks defined.

The tasks' cron never fires during the window (January 1st). For each size the
script starts K runners (default tick interval), lets them settle, then reads
pg_stat_statements (every statement the database executed in this database,
BEGIN and COMMIT included) and pg_stat_database commits over --window seconds.
The default window covers a heartbeat (every LEASE_SECONDS / 3 = 100 s) and a
retention pass (every 60 s) of each runner.

By default the runs use a private PostgreSQL cluster started by the script
(same binaries, durable commits, pg_stat_statements preloaded); --shared-pg
uses the server at PGHOST/PGPORT (commits only, unless it preloads the module).

Run (from the repository root; about --window seconds per size):

    .venv/bin/python bench/idle.py [--tasks 0,1000,100000] [--runners 2] [--window 120]

Writes bench/results/idle.json.
"""

from __future__ import annotations

import argparse
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from typing import Any

from _common import (
    Processes,
    analyze,
    bench_database,
    pg_stat_statements_ready,
    pg_work,
    private_postgres,
    wait_until,
    write_results,
)


def add_tasks(count: int) -> None:
    from scheduler_app.models import Task

    next_year = datetime(datetime.now(UTC).year + 1, 1, 1, tzinfo=UTC)
    Task.objects.bulk_create(
        [
            Task(id=f"idle-{i:06d}", name=f"Idle {i}", cron="0 0 1 1 *", timezone="", next_run_at=next_year)
            for i in range(count)
        ],
        batch_size=5000,
    )


def one_size(args: argparse.Namespace, n: int) -> dict[str, Any]:
    with ExitStack() as stack:
        db = stack.enter_context(bench_database("bench_idle"))
        procs = stack.enter_context(Processes())
        from scheduler_app.models import Runner

        add_tasks(n)
        analyze()
        statements = pg_stat_statements_ready()
        for k in range(args.runners):
            procs.start_runner(db, f"idle-{k}")
        if not wait_until(lambda: Runner.objects.count() == args.runners, 60):
            raise SystemExit("runners did not start")
        wait_until(lambda: False, args.settle, 0.5)
        before, start = pg_work(), time.monotonic()
        wait_until(lambda: False, args.window, 0.5)
        after, seconds = pg_work(), time.monotonic() - start
        procs.stop_all()
        per_second = {
            key: round((after[key] - before[key]) / seconds / args.runners, 3)
            for key in ("statements", "commits")
            if key in after
        }
        return {
            "tasks": n,
            "window_s": round(seconds, 1),
            "per_runner_per_second": per_second,
            "pg_stat_statements": statements,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="0,1000,100000")
    parser.add_argument("--runners", type=int, default=2)
    parser.add_argument("--window", type=float, default=120.0)
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--shared-pg", action="store_true")
    args = parser.parse_args()
    results: dict[str, Any] = {"runners": args.runners}
    with ExitStack() as stack:
        if not args.shared_pg:
            stack.enter_context(private_postgres())
        for n in (int(size) for size in args.tasks.split(",")):
            r = one_size(args, n)
            results[f"tasks_{n}"] = r
            print(
                f"{n} tasks, {args.runners} idle runners, {r['window_s']} s: per runner per second {r['per_runner_per_second']}"
            )
    write_results("idle", results)


if __name__ == "__main__":
    main()
