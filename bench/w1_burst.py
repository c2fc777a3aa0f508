"""W1, burst: N tasks whose cron fires once, all at the same minute T, run by K runner processes.

The runners start at least --lead seconds before T. The handler is the no-op
hook of bench/noop_hook.py: one line `<task id>,<time>,<occurrence id>` per
execution in a file per runner process; executions, latency and duplicates
are counted from those lines, not from the scheduler's tables.

Reports, per N: due-to-start latency (side-effect time - T) min/p50/p99/max,
seconds from the first to the last execution, duplicates (occurrences with
more than one line, tasks with other than one line), executions per runner,
peak RSS per runner, CPU per execution of the runners and of PostgreSQL (from
/proc, from 2 s before T until every execution ended), and database work per
execution: commits, and statements and WAL bytes from pg_stat_statements.

By default the runs use a private PostgreSQL cluster started by the script
(same binaries, durable commits, pg_stat_statements preloaded); --shared-pg
uses the server at PGHOST/PGPORT instead.

Run (from the repository root; about a minute per size plus the burst):

    .venv/bin/python bench/w1_burst.py [--tasks 1000,10000] [--runners 2] [--workers N] [--lead 40]

Writes bench/results/w1_burst.json.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

from _common import (
    TRACK_PLANNING,
    Processes,
    analyze,
    bench_database,
    cpu_seconds,
    per_execution,
    pg_reset_statements,
    pg_stat_statements_ready,
    pg_top_statements,
    pg_work,
    private_postgres,
    statement_line,
    summary,
    wait_until,
    workers_option,
    write_results,
)
from noop_hook import read_side_effects


def add_tasks(count: int, fire_at: datetime) -> None:
    from scheduler_app.models import Task

    cron = f"{fire_at.minute} {fire_at.hour} {fire_at.day} {fire_at.month} *"
    Task.objects.bulk_create(
        [
            Task(id=f"w1-{i:06d}", name=f"W1 {i}", cron=cron, timezone="", next_run_at=fire_at)
            for i in range(count)
        ],
        batch_size=5000,
    )


def one_size(args: argparse.Namespace, n: int) -> dict[str, Any]:
    with ExitStack() as stack:
        folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="w1-effects-"))
        db = stack.enter_context(bench_database("bench_w1", settings="bench.settings"))
        procs = stack.enter_context(Processes())
        from scheduler_app.models import Execution, Runner

        statements = pg_stat_statements_ready()
        env = {"BENCH_SIDE_EFFECTS": folder}
        runners = [
            procs.start_runner(db, f"w1-{k}", *workers_option(args.workers), env=env)
            for k in range(args.runners)
        ]
        started = time.time()
        if not wait_until(lambda: Runner.objects.count() == args.runners, 60):
            raise SystemExit("runners did not start:\n" + runners[0].log_tail())
        fire_at = (datetime.now(UTC) + timedelta(seconds=args.lead + 60)).replace(second=0, microsecond=0)
        add_tasks(n, fire_at)
        analyze()
        lead = fire_at.timestamp() - started
        print(f"{n} tasks due at {fire_at:%H:%M:%S}Z, {lead:.0f} s after the runners started")

        def sample() -> None:
            for runner in runners:
                runner.sample_rss()

        wait_until(lambda: time.time() >= fire_at.timestamp() - 2, lead, 0.5, sample)
        if args.top and statements:
            pg_reset_statements()
        before = pg_work()
        runner_pids = {runner.popen.pid for runner in runners}
        cpu_before = cpu_seconds(runner_pids)
        done = wait_until(lambda: len(read_side_effects(folder)) >= n, args.timeout + 2, 0.2, sample)
        wait_until(
            lambda: not Execution.objects.filter(status__in=["pending", "claimed", "running"]).exists(),
            30,
            0.2,
        )
        after = pg_work()
        cpu_after = cpu_seconds(runner_pids)
        sample()
        exit_codes = list(procs.stop_all().values())
        lines = read_side_effects(folder)
        t = fire_at.timestamp()
        latency = [at - t for _, at, _ in lines]
        per_occurrence = Counter(occurrence for _, _, occurrence in lines)
        per_task = Counter(task for task, _, _ in lines)
        return {
            "tasks": n,
            "lead_seconds": round(lead, 1),
            "all_ran": done,
            "side_effects": len(lines),
            "duplicates": sum(c - 1 for c in per_occurrence.values() if c > 1),
            "tasks_not_run_exactly_once": n - sum(1 for c in per_task.values() if c == 1),
            "due_to_start_latency_s": summary(latency, 3),
            "seconds_first_to_last_execution": round(max(latency) - min(latency), 3) if latency else None,
            "executions_per_second": round(len(lines) / (max(latency) - min(latency)), 1)
            if len(lines) > 1
            else None,
            "executions_per_runner": sorted(
                Counter(Execution.objects.values_list("owner", flat=True)).values(), reverse=True
            ),
            "runner_peak_rss_mb": [round(r.peak_rss_kb / 1024, 1) for r in runners],
            "per_execution": per_execution(before, after, n),
            # From 2 s before T until every execution ended: what the burst cost the two cores.
            "cpu_ms_per_execution": {
                name: round((cpu_after[key] - cpu_before[key]) * 1000 / n, 3)
                for name, key in (("runners", "given processes"), ("postgres", "postgres"))
            },
            "pg_stat_statements": statements,
            "runner_exit_codes": exit_codes,
            "top_statements": pg_top_statements(args.top),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="1000,10000", help="comma-separated sizes")
    parser.add_argument("--runners", type=int, default=2)
    parser.add_argument(
        "--workers", type=int, help="run_scheduler --workers; default: the WORKERS setting's default"
    )
    parser.add_argument("--lead", type=float, default=40.0)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--shared-pg", action="store_true")
    parser.add_argument("--top", type=int, default=0, help="print the N statements that took the most time")
    args = parser.parse_args()
    results: dict[str, Any] = {"runners": args.runners, "workers": args.workers or "default"}
    with ExitStack() as stack:
        if not args.shared_pg:
            stack.enter_context(private_postgres(settings=TRACK_PLANNING if args.top else None))
        for n in (int(size) for size in args.tasks.split(",")):
            r = one_size(args, n)
            results[f"tasks_{n}"] = r
            lat = r["due_to_start_latency_s"]
            print(
                f"N={n}: {r['side_effects']} ran, {r['duplicates']} duplicates,"
                f" {r['tasks_not_run_exactly_once']} tasks not run exactly once;"
                f" due-to-start min {lat.get('min')} p50 {lat.get('p50')} p99 {lat.get('p99')} max {lat.get('max')} s;"
                f" first-to-last {r['seconds_first_to_last_execution']} s ({r['executions_per_second']}/s);"
                f" per runner {r['executions_per_runner']}; peak RSS {r['runner_peak_rss_mb']} MB;"
                f" per execution {r['per_execution']}; CPU ms per execution {r['cpu_ms_per_execution']}"
            )
            for row in r["top_statements"]:
                print(statement_line(row))
    write_results("w1_burst", results)


if __name__ == "__main__":
    main()
