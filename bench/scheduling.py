"""The scheduling step alone: how fast due cron minutes become occurrences, N tasks due at once.

In-process on a private PostgreSQL cluster (as W1's): N tasks whose cron fires at the same
minute T, then ``scheduling.schedule_due(T + 0.1 s)`` called until no task is due, timed with
perf_counter; every occurrence is counted in the table afterwards. Each pass runs twice on new
tables, alternating: with the statements a PostgreSQL connection gets by default (the one
fixed statement of ``scheduler_app.postgres.scheduled`` inserts a batch and its events) and
with the ORM's (a multi-row INSERT compiled by Django, then the events), so the ratio of the
two is taken within one pass. This is the first thing W1 does at T: until its batch is
written, no occurrence of it can be claimed.

Run (from the repository root):

    .venv/bin/python bench/scheduling.py [--tasks 10000] [--repeat 3] [--shared-pg]

Writes bench/results/scheduling.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

from _common import analyze, bench_database, private_postgres, write_results

FIRE_AT = datetime(2026, 12, 7, 3, 0, tzinfo=UTC)


def one_pass(tasks: int, statements_name: str) -> dict[str, Any]:
    from django.db import connection

    from scheduler_app import statements
    from scheduler_app.models import Execution, ExecutionEvent, Task
    from scheduler_app.runner import scheduling

    for model in (ExecutionEvent, Execution, Task):
        model.objects.all().delete()
    cron = f"{FIRE_AT.minute} {FIRE_AT.hour} {FIRE_AT.day} {FIRE_AT.month} *"
    Task.objects.bulk_create(
        [
            Task(id=f"s-{i:06d}", name=f"S {i}", cron=cron, timezone="", next_run_at=FIRE_AT)
            for i in range(tasks)
        ],
        batch_size=5000,
    )
    analyze()
    chosen = statements.ORM if statements_name == "orm" else statements.journal_statements()
    setattr(connection, statements.ATTRIBUTE, chosen)
    now = FIRE_AT + timedelta(milliseconds=100)
    batches = 0
    started = time.perf_counter()
    more = True
    while more:
        _, more = scheduling.schedule_due(now, "bench")
        batches += 1
    seconds = time.perf_counter() - started
    setattr(connection, statements.ATTRIBUTE, None)
    created = Execution.objects.count()
    events = ExecutionEvent.objects.count()
    if (created, events) != (tasks, tasks):
        raise SystemExit(f"{statements_name}: {created} occurrences and {events} events for {tasks} tasks")
    return {"seconds": round(seconds, 3), "per_second": round(tasks / seconds), "batches": batches}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--shared-pg", action="store_true", help="use the server at PGHOST/PGPORT")
    args = parser.parse_args()
    with ExitStack() as stack:
        if not args.shared_pg:
            stack.enter_context(private_postgres(5545))
        stack.enter_context(bench_database("bench_scheduling", settings="bench.settings"))
        from scheduler_app import statements

        default = "postgres" if statements.journal_statements() is not statements.ORM else "orm"
        passes: dict[str, list[dict[str, Any]]] = {"default": [], "orm": []}
        for n in range(args.repeat):
            for name in ("default", "orm") if n % 2 == 0 else ("orm", "default"):
                figures = one_pass(args.tasks, default if name == "default" else "orm")
                passes[name].append(figures)
                print(f"pass {n + 1}, {name}: {figures['per_second']} occurrences/s ({figures['seconds']} s)")
    medians = {name: statistics.median(p["per_second"] for p in runs) for name, runs in passes.items()}
    ratios = [
        d["per_second"] / o["per_second"] for d, o in zip(passes["default"], passes["orm"], strict=True)
    ]
    print(
        f"{args.tasks} tasks due at once, medians of {args.repeat}: default statements "
        f"{medians['default']:.0f} occurrences/s, ORM {medians['orm']:.0f}/s; "
        f"ratio per pass {', '.join(f'{r:.2f}' for r in ratios)}"
    )
    write_results("scheduling", {"tasks": args.tasks, "passes": passes, "medians": medians, "ratios": ratios})


if __name__ == "__main__":
    main()
