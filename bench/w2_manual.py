"""W2, manual burst: one producer triggers a no-op task as fast as the Python API allows.

K warm, idle runner processes (`run_scheduler`, with `--workers W` when given) and one task whose
cron never fires. The producer (this process) calls scheduler.trigger(task)
--triggers times in a loop, as fast as it returns. The handler is the no-op
hook of bench/noop_hook.py: one line `<task id>,<time>,<occurrence id>` per
execution in a file per runner process; executions and duplicates are counted
from those lines.

Before the runners start, the journal gets --history finished executions and
the tables are ANALYZEd: a deployment's database has statistics, and plans
made on empty tables (scanning, not looking up) would stay cached in the
runners' prepared statements until autovacuum analyzes the tables, about a
minute in. --history 0 measures that fresh-install case.

Two kinds of pass, each on a fresh database and --repeat times (the median
is reported: on a shared 2-core machine single passes vary by 20 % or
more): the task with max_concurrency 32 (throughput), then with
max_concurrency 1 (serial: hand-off latency between executions). Reports end-to-end executions per second (triggers / (last side
effect - first trigger call)), the trigger call latency, duplicates, and the
database work per execution (commits; statements and WAL bytes from
pg_stat_statements, which includes the producer's own statements), and the
CPU per execution of the producer, the runners and PostgreSQL (from /proc).

By default the runs use a private PostgreSQL cluster started by the script
(same binaries, durable commits, pg_stat_statements preloaded); --shared-pg
uses the server at PGHOST/PGPORT instead.

Run (from the repository root):

    .venv/bin/python bench/w2_manual.py [--triggers 2000] [--runners 2] [--workers N]
                                        [--redis-url redis://127.0.0.1:6379/0 | --redis-url ""]
                                        [--history 10000] [--prepare-threshold 5 | none] [--repeat 5]

--prepare-threshold sets psycopg's prepare_threshold in the database OPTIONS of
the producer and the runners (5 by default here; Django's default is none,
which keeps transaction-mode poolers working): with it PostgreSQL keeps the
plans of the fixed statements instead of planning each call.

Writes bench/results/w2_manual.json.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
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
    seed_history,
    statement_line,
    summary,
    wait_until,
    workers_option,
    write_results,
)
from noop_hook import read_side_effects

TASK = "w2-noop"
WARMUP = 20


def one_pass(args: argparse.Namespace, concurrency: int, triggers: int) -> dict[str, Any]:
    with ExitStack() as stack:
        folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="w2-effects-"))
        db = stack.enter_context(
            bench_database("bench_w2", redis_url=args.redis_url or None, settings="bench.settings")
        )
        procs = stack.enter_context(Processes())
        from scheduler_app import scheduler
        from scheduler_app.models import Execution, Runner

        scheduler.register({"id": TASK, "name": "No-op", "cron": "0 0 1 1 *", "max_concurrency": concurrency})
        if args.history:
            seed_history(TASK, args.history)
            analyze()
        env = {"BENCH_SIDE_EFFECTS": folder}
        runners = [
            procs.start_runner(db, f"w2-{i}", *workers_option(args.workers), env=env)
            for i in range(args.runners)
        ]
        if not wait_until(lambda: Runner.objects.count() == args.runners, 60):
            raise SystemExit("runners did not start:\n" + runners[0].log_tail())
        for _ in range(WARMUP):
            scheduler.trigger(TASK, source="warmup", wait=30)
        statements = pg_stat_statements_ready()
        if args.top and statements:
            pg_reset_statements()
        before = pg_work()
        runner_pids = {runner.popen.pid for runner in runners}
        cpu_before = cpu_seconds(runner_pids)
        calls = []
        first = time.time()
        for _ in range(triggers):
            start = time.perf_counter()
            scheduler.trigger(TASK, source="bench")
            calls.append((time.perf_counter() - start) * 1000)
        produced = time.time()
        total = WARMUP + triggers

        def lines() -> list[tuple[str, float, str]]:
            return read_side_effects(folder)

        done = wait_until(lambda: len(lines()) >= total, args.timeout, 0.1)
        wait_until(
            lambda: (
                not Execution.objects.filter(
                    task_id=TASK, status__in=["pending", "claimed", "running"]
                ).exists()
            ),
            30,
            0.1,
        )
        cpu_after = cpu_seconds(runner_pids)
        after = pg_work()
        for runner in runners:
            runner.sample_rss()
        effects = [row for row in lines() if row[1] >= first]
        per_occurrence = Counter(occurrence for _, _, occurrence in lines())
        last = max((t for _, t, _ in effects), default=first)
        statuses = Counter(
            Execution.objects.filter(task_id=TASK, trigger_source="bench").values_list("status", flat=True)
        )
        return {
            "max_concurrency": concurrency,
            "triggers": triggers,
            "all_ran": done,
            "side_effects": len(effects),
            "duplicates": sum(n - 1 for n in per_occurrence.values() if n > 1),
            "statuses": dict(statuses),
            "executions_per_second": round(len(effects) / (last - first), 1) if last > first else None,
            "seconds_first_trigger_to_last_effect": round(last - first, 3),
            "producer_triggers_per_second": round(triggers / (produced - first), 1),
            "trigger_call_ms": summary(calls, 3),
            "per_execution": per_execution(before, after, triggers),
            # From the first trigger until every execution ended (the wait polls a little).
            "cpu_ms_per_execution": {
                name: round((cpu_after[key] - cpu_before[key]) * 1000 / triggers, 3)
                for name, key in (
                    ("producer", "this process"),
                    ("runners", "given processes"),
                    ("postgres", "postgres"),
                )
            },
            "pg_stat_statements": statements,
            "runner_peak_rss_mb": [round(r.peak_rss_kb / 1024, 1) for r in runners],
            "top_statements": pg_top_statements(args.top),
            "runner_exit_codes": list(procs.stop_all().values()),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--triggers", type=int, default=2000)
    parser.add_argument("--serial-triggers", type=int, default=500)
    parser.add_argument("--runners", type=int, default=2)
    parser.add_argument(
        "--workers", type=int, help="run_scheduler --workers; default: the WORKERS setting's default"
    )
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--shared-pg", action="store_true")
    parser.add_argument(
        "--history",
        type=int,
        default=10000,
        help="finished executions in the journal before the run (ANALYZEd)",
    )
    parser.add_argument(
        "--prepare-threshold",
        default="5",
        help="psycopg's prepare_threshold in the database OPTIONS of producer and runners; 'none': Django's default",
    )
    parser.add_argument("--only", choices=["32", "1"])
    parser.add_argument("--top", type=int, default=0, help="print the N statements that took the most time")
    parser.add_argument(
        "--repeat",
        type=int,
        default=5,
        help="passes per concurrency, each on a fresh database; the median is reported",
    )
    args = parser.parse_args()
    if args.prepare_threshold != "none":
        os.environ["BENCH_PREPARE_THRESHOLD"] = str(int(args.prepare_threshold))
    results: dict[str, Any] = {
        "runners": args.runners,
        "workers": args.workers or "default",
        "redis": bool(args.redis_url),
        "history": args.history,
        "prepare_threshold": args.prepare_threshold,
    }
    with ExitStack() as stack:
        if not args.shared_pg:
            stack.enter_context(private_postgres(settings=TRACK_PLANNING if args.top else None))
        for concurrency, triggers in ((32, args.triggers), (1, args.serial_triggers)):
            if args.only and args.only != str(concurrency):
                continue
            runs = []
            for _ in range(args.repeat):
                r = one_pass(args, concurrency, triggers)
                runs.append(r)
                c = r["trigger_call_ms"]
                print(
                    f"max_concurrency {concurrency}: {r['side_effects']}/{triggers} ran,"
                    f" {r['duplicates']} duplicates, {r['executions_per_second']} executions/s end to end,"
                    f" producer {r['producer_triggers_per_second']} triggers/s,"
                    f" trigger call p50 {c['p50']} ms p99 {c['p99']} ms; per execution {r['per_execution']};"
                    f" statuses {r['statuses']}; peak RSS {r['runner_peak_rss_mb']} MB;"
                    f" CPU ms per execution {r['cpu_ms_per_execution']}"
                )
                for row in r["top_statements"]:
                    print(statement_line(row))
            rates = sorted(r["executions_per_second"] or 0.0 for r in runs)
            median = rates[len(rates) // 2]
            results[f"max_concurrency_{concurrency}"] = {
                "median_executions_per_second": median,
                "executions_per_second": rates,
                "duplicates": sum(r["duplicates"] for r in runs),
                "runs": runs,
            }
            print(
                f"max_concurrency {concurrency}: median of {len(runs)} runs {median} executions/s ({rates})"
            )
    write_results("w2_manual", results)


if __name__ == "__main__":
    main()
