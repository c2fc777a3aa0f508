"""SQLite with two runners: warnings, sqlite errors and executions for each DATABASES OPTIONS.

For each combination of OPTIONS in COMBINATIONS, on a fresh temporary SQLite
file (never testproject/db.sqlite3): the testproject's settings (its TASKS and
hooks) with those OPTIONS, migrated; --runners `run_scheduler` processes; then
--triggers calls of `scheduler.trigger(--task)` from a producer process, as
fast as they return. When every triggered execution has ended (or --timeout
passes), the runners get SIGTERM and the script counts:

- refused: trigger calls that raised (StorageError);
- ok / runs / dupl: triggered executions that ended in success, attempts
  started (``running`` events), executions started more than once;
- tick fail: the runners' warnings of a failed tick (``database unavailable; next try in N s``);
- other warn: the runners' other WARNING lines;
- errors: every sqlite error raised in a runner or the producer, counted by
  thread, statement and the scheduler_app function that sent it (each process
  wraps the sqlite cursor and commit to see them, including those the app
  retries silently);
- s: seconds from the first trigger to the end of the last execution;
- read p50 / read max: milliseconds of what the admin's execution list reads, polled every
  20 ms by a thread of the producer during the run.

Run (from the repository root):

    .venv/bin/python bench/sqlite_two_runners.py [--triggers 200] [--runners 2] [--workers 4]
                                                [--task heartbeat | --concurrency 8] [--hold 8]
                                                [--only NAME ...] [--timeout 120]

--task triggers the given tasks of the testproject in turn (heartbeat: max_concurrency 1, so
the runners take turns); --concurrency N registers the task bench-burst with max_concurrency N
and triggers it, so that both runners claim at once. --hold S makes the producer hold the write
lock for S seconds halfway through the triggers, as a migration or a large admin action does.

Writes bench/results/sqlite_two_runners.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

from _common import ROOT, Processes, summary, wait_until, write_results

COMBINATIONS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "timeout=20": {"timeout": 20},
    "IMMEDIATE": {"transaction_mode": "IMMEDIATE"},
    "IMMEDIATE+timeout=20": {"transaction_mode": "IMMEDIATE", "timeout": 20},
    "WAL": {"init_command": "PRAGMA journal_mode=WAL"},
    "WAL+timeout=20": {"init_command": "PRAGMA journal_mode=WAL", "timeout": 20},
    "IMMEDIATE+timeout=20+WAL": {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL",
    },
    "IMMEDIATE+timeout=20+WAL+NORMAL": {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL;PRAGMA synchronous=NORMAL",
    },
    "IMMEDIATE+WAL+NORMAL+busy_timeout=20000": {
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL;PRAGMA synchronous=NORMAL;PRAGMA busy_timeout=20000",
    },
}
SOURCE = "sqlite-bench"
BURST = "bench-burst"
# Frames that only wrap the statement (the runner's statement counter), not the code that sent it.
WRAPPERS = {"__call__", "__enter__", "__exit__"}
ERROR_LINE = re.compile(
    r"^SQLITE-ERROR\|(?P<thread>[^|]*)\|(?P<statement>[^|]*)\|(?P<site>[^|]*)\|(?P<error>.*)$"
)
WARNING_LINE = re.compile(r"^WARNING\|(?P<thread>[^|]*)\|(?P<logger>[^|]*)\|(?P<message>.*)$")


# -- instrumentation (in each child process) ---------------------------------------------------


def setup_django(options: dict[str, Any]) -> None:
    """testproject.settings on SCHEDULER_DEMO_DB, with ``options`` and a log format that names threads."""
    sys.path[:0] = [str(ROOT), str(ROOT / "testproject")]
    os.environ["DJANGO_SETTINGS_MODULE"] = "testproject.settings"
    import testproject.settings as settings

    settings.DATABASES["default"]["OPTIONS"] = options
    settings.LOGGING = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"bench": {"format": "%(levelname)s|%(threadName)s|%(name)s|%(message)s"}},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "bench"}},
        "loggers": {"scheduler_app": {"handlers": ["console"], "level": "WARNING"}},
    }
    import django

    django.setup()
    watch_sqlite_errors()


def _site() -> str:
    """The three innermost scheduler_app functions on the stack (caller > callee), as module.function."""
    names = []
    for frame in reversed(traceback.extract_stack()[:-2]):
        if "/scheduler_app/" in frame.filename and frame.name not in WRAPPERS:
            module = frame.filename.rsplit("/scheduler_app/", 1)[1].removesuffix(".py").replace("/", ".")
            names.append(f"{module}.{frame.name}")
            if len(names) == 3:
                break
    return " > ".join(reversed(names)) or "-"


def _report(statement: str, exc: BaseException) -> None:
    words = " ".join(statement.split()[:4]).replace('"', "")
    line = f"SQLITE-ERROR|{threading.current_thread().name}|{words}|{_site()}|{exc}"
    print(line, file=sys.stderr, flush=True)


def watch_sqlite_errors() -> None:
    """Print one line for every sqlite error raised by a statement or a commit, then let it raise."""
    from django.db.backends.sqlite3 import base

    execute, executemany, commit = (
        base.SQLiteCursorWrapper.execute,
        base.SQLiteCursorWrapper.executemany,
        base.DatabaseWrapper._commit,
    )

    def watched_execute(self: Any, query: str, params: Any = None) -> Any:
        try:
            return execute(self, query, params)
        except sqlite3.Error as exc:
            _report(query, exc)
            raise

    def watched_executemany(self: Any, query: str, param_list: Any) -> Any:
        try:
            return executemany(self, query, param_list)
        except sqlite3.Error as exc:
            _report(query, exc)
            raise

    def watched_commit(self: Any) -> Any:
        try:
            return commit(self)
        except Exception as exc:
            _report("COMMIT", exc)
            raise

    base.SQLiteCursorWrapper.execute = watched_execute
    base.SQLiteCursorWrapper.executemany = watched_executemany
    base.DatabaseWrapper._commit = watched_commit


def child_env(db_path: str, options: dict[str, Any]) -> dict[str, str]:
    return {"SCHEDULER_DEMO_DB": db_path, "SQLITE_BENCH_OPTIONS": json.dumps(options)}


def run_runner(node: str, workers: int) -> None:
    """One instrumented run_scheduler process."""
    setup_django(json.loads(os.environ["SQLITE_BENCH_OPTIONS"]))
    from django.core.management import call_command

    call_command("run_scheduler", "--node-id", node, "--workers", str(workers))


# -- one pass (a child process per combination) ------------------------------------------------


def parse_log(text: str, errors: Counter[str], warnings: Counter[str]) -> None:
    for line in text.splitlines():
        if match := ERROR_LINE.match(line):
            thread = re.sub(r"-\d+$", "-N", match["thread"])
            error = match["error"][:60]
            errors[f"{thread} | {match['statement']} | {match['site']} | {error}"] += 1
        elif match := WARNING_LINE.match(line):
            message = re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}", "<id>", match["message"])
            message = re.sub(r"'/[^']*\.sqlite3'", "<file>", message)
            warnings[re.sub(r"\d+(\.\d+)?", "N", message)] += 1


def is_tick_failure(message: str) -> bool:
    """A failed tick's warning: ``database unavailable; next try in N s`` (or the cause, in newer
    versions), not the start-up retries."""
    return "; next try in" in message and "at start" not in message and not message.startswith("cannot start")


def one_pass(name: str, args: argparse.Namespace) -> dict[str, Any]:
    options = COMBINATIONS[name]
    folder = Path(tempfile.mkdtemp(prefix="sqlite-two-runners-"))
    try:
        return measure(name, options, folder, args)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def measure(name: str, options: dict[str, Any], folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    os.environ.update(child_env(str(folder / "db.sqlite3"), options))
    setup_django(options)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django.db import connections

    from scheduler_app import scheduler
    from scheduler_app.exceptions import SchedulerError
    from scheduler_app.models import TERMINAL, Execution, ExecutionEvent, Runner, Status

    if args.concurrency:
        scheduler.register(
            {"id": BURST, "name": "Bench burst", "cron": "0 0 1 1 *", "max_concurrency": args.concurrency}
        )
    triggered = Execution.objects.filter(trigger_source=SOURCE)
    producer_log = folder / "producer.log"
    stderr, sys.stderr = sys.stderr, open(producer_log, "w")  # noqa: SIM115 - the producer's error lines
    refused = 0
    reader = Reader()
    try:
        with Processes(grace=40) as procs:
            runners = [
                procs.start(
                    f"runner-{i}",
                    [sys.executable, __file__, "--runner", f"runner-{i}", "--workers", str(args.workers)],
                    os.environ.copy(),
                )
                for i in range(args.runners)
            ]
            if not wait_until(lambda: Runner.objects.count() == args.runners, 60):
                raise SystemExit(f"runners did not start:\n{runners[0].log_tail()}")
            reader.start()
            first_trigger = time.monotonic()
            tasks = args.task.split(",")
            for i in range(args.triggers):
                if args.hold and i == args.triggers // 2:
                    hold_the_write_lock(args.hold)
                try:
                    scheduler.trigger(tasks[i % len(tasks)], source=SOURCE)
                except SchedulerError:
                    refused += 1

            def all_ended() -> bool:
                return not triggered.exclude(status__in=[*TERMINAL, Status.UNKNOWN]).exists()

            ended = wait_until(all_ended, args.timeout, interval=0.25)
            seconds = time.monotonic() - first_trigger
            reader.stop()
            procs.stop_all()
            logs = [child.log_path.read_text(errors="replace") for child in runners]
    finally:
        sys.stderr.close()
        sys.stderr = stderr
    statuses = Counter(triggered.values_list("status", flat=True))
    starts = Counter(
        ExecutionEvent.objects.filter(execution__trigger_source=SOURCE, to_status=Status.RUNNING).values_list(
            "execution_id", flat=True
        )
    )
    connections.close_all()
    errors: Counter[str] = Counter()
    warnings: Counter[str] = Counter()
    for text in logs:
        parse_log(text, errors, warnings)
    producer: Counter[str] = Counter()
    parse_log(producer_log.read_text(errors="replace"), producer, Counter())
    errors.update({f"producer: {key}": n for key, n in producer.items()})
    tick_failures = sum(n for message, n in warnings.items() if is_tick_failure(message))
    return {
        "name": name,
        "options": options,
        "triggers": args.triggers,
        "refused": refused,
        "executions": sum(statuses.values()),
        "statuses": dict(statuses),
        "success": statuses.get(Status.SUCCESS, 0),
        "runs": sum(starts.values()),
        "duplicates": sum(1 for n in starts.values() if n > 1),
        "all_ended": ended,
        "seconds": round(seconds, 1),
        "reads": summary(reader.latencies_ms, 1),
        "tick_failures": tick_failures,
        "other_warnings": sum(warnings.values()) - tick_failures,
        "warnings": dict(warnings.most_common()),
        "sqlite_errors": sum(errors.values()),
        "errors": dict(errors.most_common()),
    }


def hold_the_write_lock(seconds: float) -> None:
    """A long write transaction, as a migration or a large admin action makes one: the lock is
    taken by a write that changes nothing and held ``seconds``."""
    from django.db import transaction

    from scheduler_app.models import Runner

    with transaction.atomic():
        Runner.objects.filter(node_id="").update(host="")
        time.sleep(seconds)


class Reader(threading.Thread):
    """What the admin's execution list reads (the newest 100 rows and the count), every 20 ms,
    with its latency; a read that raised counts as an error line, not a latency."""

    def __init__(self) -> None:
        super().__init__(name="reader", daemon=True)
        self.latencies_ms: list[float] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        from django.db import DatabaseError, connections

        from scheduler_app.models import Execution

        try:
            while not self._stop_event.wait(0.02):
                began = time.perf_counter()
                try:
                    list(Execution.objects.order_by("-sequence")[:100])
                    Execution.objects.count()
                except DatabaseError:
                    continue
                self.latencies_ms.append((time.perf_counter() - began) * 1000)
        finally:
            connections.close_all()

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


# -- the table ---------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--triggers", type=int, default=200)
    parser.add_argument("--runners", type=int, default=2)
    parser.add_argument("--task", help="task ids to trigger in turn, comma-separated (default heartbeat)")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=0,
        help=f"register {BURST!r} with this max_concurrency and trigger it",
    )
    parser.add_argument("--workers", type=int, default=4, help="worker threads per runner")
    parser.add_argument(
        "--hold", type=float, default=0, help="halfway through the triggers, hold the write lock this long"
    )
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--only", nargs="+", choices=sorted(COMBINATIONS), help="combinations to run")
    parser.add_argument("--pass", dest="one", help=argparse.SUPPRESS)
    parser.add_argument("--runner", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.task = args.task or (BURST if args.concurrency else "heartbeat")
    if args.runner:
        run_runner(args.runner, args.workers)
        return
    if args.one:
        print(json.dumps(one_pass(args.one, args)))
        return
    results = []
    passthrough = ["--triggers", str(args.triggers), "--runners", str(args.runners), "--task", args.task]
    passthrough += ["--timeout", str(args.timeout), "--workers", str(args.workers)]
    passthrough += ["--concurrency", str(args.concurrency), "--hold", str(args.hold)]
    for name in args.only or list(COMBINATIONS):
        done = subprocess.run(
            [sys.executable, __file__, "--pass", name, *passthrough],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            print(f"{name}: the pass failed (exit {done.returncode})")
            continue
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(
        f"\n{args.runners} runners of {args.workers} workers, {args.triggers} triggers of {args.task!r}"
        f"{f' (max_concurrency {args.concurrency})' if args.concurrency else ''}, one SQLite file"
        f"{f'; the write lock held {args.hold:g} s halfway' if args.hold else ''}\n"
    )
    print_table(results)
    write_results("sqlite_two_runners", {**vars(args), "results": results})


def print_table(results: list[dict[str, Any]]) -> None:
    columns = [
        "refused",
        "ok",
        "runs",
        "dupl",
        "tick fail",
        "other warn",
        "errors",
        "s",
        "read p50",
        "read max",
    ]
    header = f"{'OPTIONS':40}" + "".join(f" {column:>{max(4, len(column))}}" for column in columns)
    print(header)
    print("-" * len(header))
    for r in results:
        cells = [
            r["refused"],
            r["success"],
            r["runs"],
            r["duplicates"],
            r["tick_failures"],
            r["other_warnings"],
            r["sqlite_errors"],
            r["seconds"],
            r["reads"].get("p50", "-"),
            r["reads"].get("max", "-"),
        ]
        print(
            f"{r['name']:40}"
            + "".join(f" {cell:>{max(4, len(column))}}" for column, cell in zip(columns, cells, strict=True))
        )
    print("(s: first trigger to last end; read: ms of the admin's execution-list read)")
    for r in results:
        if r["errors"] or r["warnings"]:
            print(f"\n{r['name']}:")
            for key, n in r["errors"].items():
                print(f"  {n:>4}  error   {key}")
            for key, n in r["warnings"].items():
                print(f"  {n:>4}  warning {key}")


if __name__ == "__main__":
    main()
