"""Bulk triggers: how many occurrences scheduler.trigger_many creates per second, and how fast they run.

Every scheduler setting at its default: two `run_scheduler` processes with the default worker
count, no Redis, Django's default database OPTIONS, a new empty journal. One task (max_concurrency
--concurrency, 32 unless given; the no-op hook of bench/noop_hook.py); the producer (this process)
creates --occurrences occurrences with trigger_many in batches of --batch, while the runners run
them. In the same pass, on a fresh database, the same number of single trigger() calls give the
ratio between the two.

Reported per pass (the median of --repeat passes is printed last):

- created/s: occurrences / seconds spent inside the producer's calls;
- executed/s: occurrences / (last side effect - first call), end to end;
- duplicates (from the side-effect lines), executions per runner, the CPU per execution of the
  producer, the runners and PostgreSQL (from /proc), and the runners' peak RSS;
- where the task's slots went (slot_times): an execution holds one of its task's max_concurrency
  slots from its claim to its outcome's commit, so a task runs at most max_concurrency / that time
  executions a second; with utilisation near 1, the slots, not the machine, bound the pass.

Run (from the repository root):

    .venv/bin/python bench/trigger_many.py [--occurrences 10000] [--batch 1000] [--repeat 3]
        [--concurrency 32] [--calls trigger_many,trigger] [--top N]

--calls runs only the passes named; --top N prints the N statements that took the most time in
each pass, with their planning time (pg_stat_statements of the private cluster).

By default the runs use a private PostgreSQL cluster started by the script (same binaries,
durable commits); --shared-pg uses the server at PGHOST/PGPORT instead.

Writes bench/results/trigger_many.json.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from typing import Any

from _common import (
    TRACK_PLANNING,
    Processes,
    bench_database,
    cpu_seconds,
    pg_reset_statements,
    pg_stat_statements_ready,
    pg_top_statements,
    private_postgres,
    statement_line,
    wait_until,
    write_results,
)
from noop_hook import read_side_effects

TASK = "fan-out"


def slot_times(concurrency: int) -> dict[str, Any]:
    """Where a slot of the task went, from the journal's events (each stamped with its runner's
    clock; an outcome's as its batch is written, just before its commit): claim to start and start
    to outcome (medians, ms), and how busy the task's slots were between the first claim and the
    last outcome (the occupied time over concurrency x that span). An execution fills a slot from
    its claim to its outcome's commit, so the executions a second are at most concurrency / (claim
    to outcome): when utilisation is near 1, the slots bind."""
    from django.db import connection

    from scheduler_app.models import ExecutionEvent, Status

    with connection.cursor() as cursor:
        cursor.execute(
            "WITH e AS (SELECT execution_id, MIN(at) FILTER (WHERE to_status = %s) AS claimed,"
            " MIN(at) FILTER (WHERE to_status = %s) AS started, MAX(at) FILTER (WHERE to_status = %s) AS ended"
            f" FROM {connection.ops.quote_name(ExecutionEvent._meta.db_table)} GROUP BY execution_id)"
            " SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM started - claimed)),"
            " percentile_cont(0.5) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM ended - started)),"
            " SUM(EXTRACT(EPOCH FROM ended - claimed)), EXTRACT(EPOCH FROM MAX(ended) - MIN(claimed)),"
            " COUNT(*) FILTER (WHERE started = claimed) FROM e",
            [Status.CLAIMED, Status.RUNNING, Status.SUCCESS],
        )
        to_start, to_outcome, occupied, span, started_by_claim = cursor.fetchone()
    if not span:
        return {}
    return {
        "claim_to_start_ms": round(float(to_start) * 1000, 2),
        "start_to_outcome_ms": round(float(to_outcome) * 1000, 2),
        "started_by_their_claim": started_by_claim,
        "slot_utilisation": round(float(occupied) / (concurrency * float(span)), 2),
    }


def one_pass(args: argparse.Namespace, bulk: bool) -> dict[str, Any]:
    with ExitStack() as stack:
        folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="bulk-effects-"))
        db = stack.enter_context(bench_database("bench_bulk", settings="bench.settings"))
        procs = stack.enter_context(Processes())
        from scheduler_app import scheduler
        from scheduler_app.models import Execution, Runner

        scheduler.register({"id": TASK, "cron": "0 0 1 1 *", "max_concurrency": args.concurrency})
        workers = ("--workers", str(args.workers)) if args.workers else ()
        env = {"BENCH_SIDE_EFFECTS": folder}
        runners = [procs.start_runner(db, f"bulk-{i}", *workers, env=env) for i in range(args.runners)]
        if not wait_until(lambda: Runner.objects.count() == args.runners, 60):
            raise SystemExit("runners did not start:\n" + runners[0].log_tail())
        if args.top and pg_stat_statements_ready():
            pg_reset_statements()
        runner_pids = {runner.popen.pid for runner in runners}
        cpu_before = cpu_seconds(runner_pids)
        calls = 0.0
        first = time.time()
        for start in range(0, args.occurrences, args.batch):
            size = min(args.batch, args.occurrences - start)
            began = time.perf_counter()
            if bulk:
                scheduler.trigger_many(
                    TASK, [{"params": {"n": start + n}} for n in range(size)], source="bench"
                )
            else:
                for n in range(size):
                    scheduler.trigger(TASK, source="bench", params={"n": start + n})
            calls += time.perf_counter() - began
        ran = wait_until(lambda: len(read_side_effects(folder)) >= args.occurrences, args.timeout, 0.1)
        effects = read_side_effects(folder)
        cpu_after = cpu_seconds(runner_pids)
        slots = slot_times(args.concurrency)
        for runner in runners:
            runner.sample_rss()
        per_occurrence = Counter(occurrence for _, _, occurrence in effects)
        last = max((t for _, t, _ in effects), default=first)
        return {
            "call": "trigger_many" if bulk else "trigger",
            "all_ran": ran,
            "side_effects": len(effects),
            "duplicates": sum(n - 1 for n in per_occurrence.values() if n > 1),
            "created_per_second": round(args.occurrences / calls, 1),
            "executed_per_second": round(len(effects) / (last - first), 1) if last > first else None,
            "executions_per_runner": sorted(
                Counter(Execution.objects.values_list("owner", flat=True)).values(), reverse=True
            ),
            # From the first call until every side effect was written (the wait polls a little).
            "cpu_ms_per_execution": {
                name: round((cpu_after[key] - cpu_before[key]) * 1000 / args.occurrences, 3)
                for name, key in (
                    ("producer", "this process"),
                    ("runners", "given processes"),
                    ("postgres", "postgres"),
                )
            },
            "slots": slots,
            "runner_peak_rss_mb": [round(r.peak_rss_kb / 1024, 1) for r in runners],
            "top_statements": pg_top_statements(args.top),
            "runner_exit_codes": list(procs.stop_all().values()),
        }


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--occurrences", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--runners", type=int, default=2)
    parser.add_argument(
        "--workers", type=int, help="run_scheduler --workers (tuned); default: the WORKERS setting"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=32,
        help="the task's max_concurrency (the slots its executions share)",
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--shared-pg", action="store_true")
    parser.add_argument(
        "--calls", default="trigger_many,trigger", help="the passes to run: trigger_many, trigger or both"
    )
    parser.add_argument("--top", type=int, default=0, help="print the N statements that took the most time")
    args = parser.parse_args()
    results: dict[str, Any] = {
        "occurrences": args.occurrences,
        "batch": args.batch,
        "runners": args.runners,
        "workers": args.workers or "default",
        "concurrency": args.concurrency,
    }
    with ExitStack() as stack:
        if not args.shared_pg:
            stack.enter_context(private_postgres(settings=TRACK_PLANNING if args.top else None))
        passes: dict[str, list[dict[str, Any]]] = {"trigger_many": [], "trigger": []}
        for _ in range(args.repeat):
            for bulk in (call == "trigger_many" for call in args.calls.split(",")):
                r = one_pass(args, bulk)
                passes[r["call"]].append(r)
                print(
                    f"{r['call']}: {r['side_effects']}/{args.occurrences} ran, {r['duplicates']} duplicates,"
                    f" {r['created_per_second']} created/s, {r['executed_per_second']} executed/s end to end,"
                    f" per runner {r['executions_per_runner']}, CPU ms per execution {r['cpu_ms_per_execution']},"
                    f" peak RSS {r['runner_peak_rss_mb']} MB"
                )
                if r["slots"]:
                    print(
                        f"  slots: claim to start p50 {r['slots']['claim_to_start_ms']} ms"
                        f" ({r['slots']['started_by_their_claim']} started by their claim),"
                        f" start to outcome p50 {r['slots']['start_to_outcome_ms']} ms,"
                        f" utilisation {r['slots']['slot_utilisation']} of {args.concurrency}"
                    )
                for row in r["top_statements"]:
                    print(statement_line(row))
        for call, runs in passes.items():
            if not runs:
                continue
            results[call] = {
                "median_created_per_second": median([r["created_per_second"] for r in runs]),
                "median_executed_per_second": median([r["executed_per_second"] or 0.0 for r in runs]),
                "duplicates": sum(r["duplicates"] for r in runs),
                "runs": runs,
            }
        figures = [
            f"{call}{' (batches of ' + str(args.batch) + ')' if call == 'trigger_many' else ''}"
            f" {results[call]['median_created_per_second']} created/s,"
            f" {results[call]['median_executed_per_second']} executed/s"
            for call in passes
            if call in results
        ]
        if "trigger_many" in results and "trigger" in results:
            ratio = (
                results["trigger_many"]["median_created_per_second"]
                / results["trigger"]["median_created_per_second"]
            )
            figures.append(f"created ratio {ratio:.1f}x")
        duplicates = sum(results[call]["duplicates"] for call in passes if call in results)
        print(
            f"medians of {args.repeat} passes, {args.runners} runners, max_concurrency {args.concurrency},"
            f" {f'--workers {args.workers}' if args.workers else 'every setting at its default'}: "
            + "; ".join(figures)
            + f"; duplicates {duplicates}"
        )
    write_results("trigger_many", results)


if __name__ == "__main__":
    main()
