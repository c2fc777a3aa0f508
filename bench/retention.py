"""Journal retention: how fast a turn deletes, and what it costs a burst of work running beside it.

Each pass, on a fresh database of the private PostgreSQL cluster: --history executions that ended
40 days ago (with three events and one log row each, inserted by SQL in a few statements), then
W1: --tasks tasks due at the same minute, run by two `run_scheduler` processes with every setting
at its default (the no-op hook of bench/noop_hook.py). In a "pruning" pass, a turn of journal
retention (scheduler_app.retention.prune_journal, JOURNAL_RETENTION_DAYS 30) starts one second
before the due minute, in this process, with a budget of --budget seconds, so that it deletes
while the burst runs; a "quiet" pass runs the same burst without it. The passes alternate,
--repeat times each; medians are printed last.

Reported per pass: W1's due-to-start p50 and p99 and executions once each (duplicates), and for
the pruning pass the executions, events and log rows the turn deleted, its seconds and the
executions deleted per second. How long filling the history took is printed too.

Run (from the repository root):

    .venv/bin/python bench/retention.py [--history 300000] [--tasks 1000] [--repeat 2] [--budget 20]

Writes bench/results/retention.json.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections import Counter
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

from _common import (
    Processes,
    analyze,
    bench_database,
    private_postgres,
    summary,
    wait_until,
    write_results,
)
from noop_hook import read_side_effects
from w1_burst import add_tasks

HISTORY_TASK = "history"
LEAD_SECONDS = 40


def fill_history(rows: int) -> float:
    """``rows`` executions that ended 40 days ago, three events and one log row each; seconds taken."""
    from django.db import connection

    from scheduler_app.models import Execution, ExecutionEvent, ExecutionLog

    execution, event, log = (
        connection.ops.quote_name(m._meta.db_table) for m in (Execution, ExecutionEvent, ExecutionLog)
    )
    began = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {execution} (occurrence_id, task_id, task_revision, trigger_type, trigger_source,"
            " idempotency_key, payload_hash, scheduled_for, due_at, params, status, attempt, max_attempts,"
            " owner, execution_token, lease_expires_at, stop_requested, result, error, handler_ref,"
            " created_at, started_at, finished_at, updated_at, log_persistence)"
            " SELECT gen_random_uuid(), %s, 1, 'manual', 'history', NULL, '', NULL, d, '{}', 'success', 1, 1,"
            " 'old-runner', '', NULL, false, NULL, NULL, '', d, d, d, d, 'persisted'"
            " FROM (SELECT now() - interval '40 days' + n * interval '1 millisecond' AS d"
            "       FROM generate_series(1, %s) AS n) AS s",
            [HISTORY_TASK, rows],
        )
        cursor.execute(
            f"INSERT INTO {event} (execution_id, at, from_status, to_status, reason, node, attempt)"
            f" SELECT e.sequence, e.finished_at, m.f, m.t, m.r, 'old-runner', 1 FROM {execution} e"
            " CROSS JOIN (VALUES ('pending', 'claimed', 'claimed'), ('claimed', 'running', 'started'),"
            " ('running', 'success', 'succeeded')) AS m(f, t, r)"
        )
        cursor.execute(
            f"INSERT INTO {log} (id, occurrence_id, task_id, task_name, trigger_type, trigger_source, status,"
            " result, error, attempt, started_at, finished_at, duration_ms)"
            f" SELECT gen_random_uuid(), occurrence_id, task_id, task_id, 'manual', 'history', 'success',"
            f" NULL, NULL, 1, started_at, finished_at, 0 FROM {execution}"
        )
        for table in (execution, event, log):
            cursor.execute(f"VACUUM ANALYZE {table}")
    return time.perf_counter() - began


def one_pass(args: argparse.Namespace, pruning: bool) -> dict[str, Any]:
    with ExitStack() as stack:
        folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="retention-effects-"))
        db = stack.enter_context(bench_database("bench_retention", settings="bench.settings"))
        procs = stack.enter_context(Processes())
        from django.db import connections
        from django.test import override_settings

        from scheduler_app import retention
        from scheduler_app.models import Execution, Runner

        fill_seconds = fill_history(args.history)
        env = {"BENCH_SIDE_EFFECTS": folder}
        runners = [procs.start_runner(db, f"retention-{k}", env=env) for k in range(2)]
        if not wait_until(lambda: Runner.objects.count() == 2, 60):
            raise SystemExit("runners did not start:\n" + runners[0].log_tail())
        fire_at = (datetime.now(UTC) + timedelta(seconds=LEAD_SECONDS + 60)).replace(second=0, microsecond=0)
        add_tasks(args.tasks, fire_at)
        analyze()
        wait_until(lambda: time.time() >= fire_at.timestamp() - 1, LEAD_SECONDS + 60, 0.2)
        turn: dict[str, Any] = {}

        def prune() -> None:
            try:
                with override_settings(SCHEDULER_APP={"JOURNAL_RETENTION_DAYS": 30}):
                    turn["pruned"] = retention.prune_journal(datetime.now(UTC), budget_seconds=args.budget)
            finally:
                connections.close_all()

        pruner = threading.Thread(target=prune)
        if pruning:
            pruner.start()
        done = wait_until(lambda: len(read_side_effects(folder)) >= args.tasks, args.timeout, 0.2)
        if pruning:
            pruner.join()
        lines = read_side_effects(folder)
        exit_codes = list(procs.stop_all().values())
        latency = [at - fire_at.timestamp() for _, at, _ in lines]
        per_occurrence = Counter(occurrence for _, _, occurrence in lines)
        result: dict[str, Any] = {
            "pass": "pruning" if pruning else "quiet",
            "history": args.history,
            "fill_seconds": round(fill_seconds, 1),
            "all_ran": done,
            "side_effects": len(lines),
            "duplicates": sum(c - 1 for c in per_occurrence.values() if c > 1),
            "due_to_start_latency_s": summary(latency, 3),
            "history_left": Execution.objects.filter(task_id=HISTORY_TASK).count(),
            "runner_exit_codes": exit_codes,
        }
        pruned = turn.get("pruned")
        if pruned is not None:
            result["deleted"] = {
                "executions": pruned.executions,
                "events": pruned.events,
                "logs": pruned.logs,
                "seconds": pruned.seconds,
                "executions_per_second": round(pruned.executions / pruned.seconds, 1)
                if pruned.seconds
                else None,
            }
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", type=int, default=300_000)
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--budget", type=float, default=20.0, help="seconds the retention turn may delete for"
    )
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    passes: dict[str, list[dict[str, Any]]] = {"quiet": [], "pruning": []}
    with ExitStack() as stack:
        stack.enter_context(private_postgres())
        for _ in range(args.repeat):
            for pruning in (False, True):
                r = one_pass(args, pruning)
                passes[r["pass"]].append(r)
                lat = r["due_to_start_latency_s"]
                deleted = r.get("deleted")
                print(
                    f"{r['pass']}: history of {r['history']:,} filled in {r['fill_seconds']} s;"
                    f" W1 {r['side_effects']}/{args.tasks} ran, {r['duplicates']} duplicates,"
                    f" due-to-start p50 {lat.get('p50')} p99 {lat.get('p99')} s"
                    + (
                        f"; the turn deleted {deleted['executions']:,} executions, {deleted['events']:,} events,"
                        f" {deleted['logs']:,} log rows in {deleted['seconds']} s"
                        f" ({deleted['executions_per_second']:,} executions/s)"
                        if deleted
                        else ""
                    )
                )
    quiet_p99 = statistics.median(r["due_to_start_latency_s"]["p99"] for r in passes["quiet"])
    pruning_p99 = statistics.median(r["due_to_start_latency_s"]["p99"] for r in passes["pruning"])
    rate = statistics.median(r["deleted"]["executions_per_second"] or 0 for r in passes["pruning"])
    print(
        f"medians of {args.repeat}: W1 ({args.tasks} tasks, defaults) due-to-start p99 {quiet_p99} s quiet,"
        f" {pruning_p99} s while a retention turn deletes ({pruning_p99 / quiet_p99:.2f}x);"
        f" the turn deleted {rate:,} executions/s (each with 3 events and a log row)"
    )
    write_results("retention", {"args": vars(args), "passes": passes})


if __name__ == "__main__":
    main()
