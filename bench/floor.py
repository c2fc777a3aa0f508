"""The floor: pgbench running the SQL a runner needs per execution, and nothing else.

What the runner writes on PostgreSQL for one manual execution of a task
whose handler returns None (the no-op hook of the other workloads), in three
statements in autocommit, each a durable commit as each of the runner's is:

1. claim: due pending rows, oldest first, locked FOR UPDATE SKIP LOCKED,
   set claimed with owner, a fresh token (a random nonce and the sequence),
   a lease of 300 s, attempt + 1 and updated_at; one event row each
   (pending -> claimed, "claimed"). The runner's claim is a transaction of
   four statements (postgres/claims.py: the candidates read, the task
   locks, the slot count for max_concurrency, then this UPDATE with its
   events, which also copies the task's revision); the floor keeps the
   lock and the UPDATE, in one statement.
2. start: postgres/batch.py's start statement: the rows still owned
   (sequence, token, claimed, no stop requested) locked in sequence order,
   then claimed -> running with started_at and updated_at; one event row
   each ("started").
3. finish: postgres/batch.py's finish statement, for a success: the rows
   still owned (running) locked, then finished_at, result and error (NULL,
   as for the no-op's None), the lease cleared, log_persistence "persisted";
   one event row each ("succeeded"); and the attempt's ExecutionLog row,
   upserted on its id, which the runner writes in this same statement on a
   first attempt with the logs in the default database. The floor includes
   the log row.

So per execution: one execution row updated three times, three event rows,
one log row. Left out: the rest of the claim transaction (above), the
trigger that inserted the row, the runner's probe, heartbeat and lease
renewals, and all Python. The runner sends start and finish values as
arrays and a JSON document; here the sequences and tokens the claim returns
travel to the next statements through pgbench's \\gset, as arrays; the log
row's id is md5(occurrence id, attempt) where the runner takes a uuid5 of
the same two.

Two variants, each -c 2 -j 2 for --seconds: one occurrence per pgbench
transaction, and 10 (claim 10 rows in one statement, start the 10, finish
the 10). Executions/s = transactions/s x batch.

Beside them, the trigger floor (--no-trigger leaves it out): what W2's one
producer sends per execution, and nothing else. One pgbench client (-c 1,
as the producer is one thread calling trigger() in a loop) runs
postgres/trigger.py's statement in autocommit, one trigger per transaction:
the task row read, the execution row and its creation event inserted, a
durable commit. Its values are written into the text where the producer
binds them (each occurrence id time-ordered, as trigger()'s uuid7).
Triggers/s is the most W2 can execute with one producer, however fast its
runners; checked afterwards: one pending row and one event per trigger. Then
the same statement from Python: psycopg 3 alone, one connection in
autocommit, the statement prepared, its nine values bound as trigger() binds
them, one call after the other for --seconds: what a Python producer gets
from its driver, without Django's or scheduler_app's Python; then
scheduler.trigger() itself in the same loop, through Django's connection at
its default settings. Each prints the client's CPU per call beside its
rate, and each is checked the same way. Before each run the journal
tables are emptied and refilled with pending occurrences of one task, for
twice the fastest rate so far (a run that empties the queue is run again
with twice the rows), then vacuumed, analyzed and checkpointed. Every run
is checked afterwards: no row left claimed or running, three events and one
log row per succeeded execution. The variants alternate, --repeat times; the
medians are reported: executions/s, and per execution the statements sent
(3 / batch) and those pg_stat_statements counted (adding the foreign-key
check PostgreSQL runs for each event row), commits and WAL bytes.

By default on a private PostgreSQL cluster on port 5562 (same binaries,
durable commits, pg_stat_statements for the statement and WAL counts);
--shared-pg uses the server at PGHOST/PGPORT. pgbench's -M (--protocol) is
"prepared" by default: a floor with the planning left out, as the runners
with psycopg's prepare_threshold set.

Run (from the repository root):

    .venv/bin/python bench/floor.py [--seconds 20] [--repeat 3] [--protocol prepared]

Writes bench/results/floor.json.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _common import (
    bench_database,
    per_execution,
    pg_conninfo,
    pg_stat_statements_ready,
    pg_work,
    private_postgres,
    write_results,
)

PORT = 5562
TASK = "floor-noop"
NODE = "floor"
BATCHES = (1, 10, 32)
# Rows per second a run is sized for at least (or the fastest run before it, if faster).
FIRST_GUESS = 10_000


def pgbench_binary() -> str:
    return shutil.which("pgbench") or "/usr/lib/postgresql/15/bin/pgbench"


def script(batch: int, protocol: str) -> str:
    """The pgbench script: claim ``batch`` rows, start them, finish them; three statements."""
    from scheduler_app.models import Execution, ExecutionEvent, ExecutionLog

    execution, event, log = (m._meta.db_table for m in (Execution, ExecutionEvent, ExecutionLog))
    # Simple protocol pastes a variable's text into the statement; the others bind it.
    seqs, tokens = ("':seqs'", "':tokens'") if protocol == "simple" else (":seqs", ":tokens")
    events = f"INSERT INTO {event} (execution_id, at, from_status, to_status, reason, node, attempt)"

    def owned(status_test: str) -> str:
        """``l``: the claimed rows still owned (token and status), locked in sequence order, one
        primary-key lookup each; as postgres/batch.py's ``_owned_rows``."""
        return (
            f"v AS (SELECT * FROM unnest({seqs}::bigint[], {tokens}::text[]) AS v(sequence, token)),"
            f" l AS (SELECT v.* FROM v CROSS JOIN LATERAL (SELECT 1 FROM {execution} e"
            f" WHERE e.sequence = v.sequence AND e.execution_token = v.token AND {status_test}"
            " FOR UPDATE OF e) x)"
        )

    log_fields = (
        "occurrence_id, task_id, task_name, trigger_type, trigger_source, status, result, error,"
        " attempt, started_at, finished_at, duration_ms"
    )
    upsert = ", ".join(f"{name} = EXCLUDED.{name}" for name in log_fields.split(", "))
    claim = f"""
WITH c AS (SELECT sequence FROM {execution} WHERE status = 'pending' AND due_at <= now()
      ORDER BY due_at, sequence LIMIT {batch} FOR UPDATE SKIP LOCKED),
  u AS (UPDATE {execution} e SET status = 'claimed', owner = '{NODE}',
      execution_token = (SELECT md5(random()::text)) || e.sequence::text,
      lease_expires_at = now() + interval '300 seconds', attempt = e.attempt + 1, updated_at = now()
      FROM c WHERE e.sequence = c.sequence AND e.status = 'pending'
      RETURNING e.sequence, e.execution_token, e.attempt),
  i AS ({events} SELECT sequence, now(), 'pending', 'claimed', 'claimed', '{NODE}', attempt FROM u)
SELECT array_agg(sequence) AS seqs, array_agg(execution_token) AS tokens FROM u \\gset
"""
    start = f"""
WITH {owned("e.status = 'claimed' AND NOT e.stop_requested")},
  u AS (UPDATE {execution} e SET status = 'running', started_at = now(), updated_at = now()
      FROM l WHERE e.sequence = ANY({seqs}::bigint[]) AND e.sequence = l.sequence
      RETURNING e.sequence, e.attempt),
  i AS ({events} SELECT sequence, now(), 'claimed', 'running', 'started', '{NODE}', attempt FROM u)
SELECT sequence FROM u;
"""
    finish = f"""
WITH {owned("e.status = 'running'")},
  u AS (UPDATE {execution} e SET status = 'success', updated_at = now(), log_persistence = 'persisted',
      finished_at = now(), lease_expires_at = NULL, result = NULL, error = NULL
      FROM l WHERE e.sequence = ANY({seqs}::bigint[]) AND e.sequence = l.sequence
      RETURNING e.sequence, e.attempt, e.occurrence_id, e.task_id, e.trigger_type, e.trigger_source,
      e.started_at, e.finished_at),
  i AS ({events} SELECT sequence, now(), 'running', 'success', 'succeeded', '{NODE}', attempt FROM u),
  g AS (INSERT INTO {log} (id, {log_fields})
      SELECT md5(occurrence_id::text || attempt)::uuid, occurrence_id, task_id, 'No-op', trigger_type,
      trigger_source, 'success', NULL, NULL, attempt, started_at, finished_at,
      (extract(epoch FROM finished_at - started_at) * 1000)::bigint FROM u
      ON CONFLICT (id) DO UPDATE SET {upsert})
SELECT sequence FROM u;
"""
    return claim + start + finish


def trigger_script() -> str:
    """The trigger floor's pgbench script: the statement of a manual trigger, its values as text."""
    from scheduler_app.postgres.trigger import _statement

    values = {
        # Time-ordered, as trigger()'s uuid7: the microseconds first, then random bits.
        "occurrence_id": "encode(overlay(uuid_send(gen_random_uuid()) PLACING"
        " int8send((extract(epoch FROM clock_timestamp()) * 1000000)::bigint) FROM 1 FOR 8), 'hex')::uuid",
        "task_id": f"'{TASK}'",
        "trigger_source": "'bench'",
        "idempotency_key": "NULL",
        "payload_hash": "''",
        "due_at": "now()",
        "now": "now()",
        "params": "'{}'::jsonb",
        "reason": "'triggered by bench'",
    }
    text = _statement(False)
    for name, value in values.items():
        text = text.replace(f"%({name})s", value)
    assert "%(" not in text, text
    return text + ";\n"


def trigger_run(args: argparse.Namespace, folder: Path, dbname: str) -> dict[str, Any]:
    """An empty journal and the task row, then pgbench -c 1 running the trigger statement; checked."""
    from scheduler_app.models import Task

    path = folder / "floor_trigger.sql"
    path.write_text(trigger_script())
    Task.objects.update_or_create(id=TASK, defaults={"name": "No-op", "cron": "0 0 1 1 *"})
    fill(0)
    before = pg_work()
    out = run_pgbench(path, args.seconds, args.protocol, dbname, clients=1)
    after = pg_work()
    assert out is not None
    found = counts()
    if found.get("pending", 0) != out["transactions"] or found["events"] != out["transactions"]:
        raise SystemExit(f"trigger: pgbench counted {out['transactions']} triggers, the tables hold {found}")
    return {
        **out,
        "batch": 1,
        "executions_per_second": round(out["tps"], 1),
        "succeeded": out["transactions"],
        "per_execution": per_execution(before, after, out["transactions"]),
    }


@contextmanager
def psycopg_trigger(dbname: str) -> Iterator[Callable[[], None]]:
    """psycopg alone sending trigger()'s statement: one connection in autocommit, the statement
    prepared (prepare_threshold 0), its nine values bound as trigger() binds them."""
    import psycopg
    from psycopg.types.json import Jsonb

    from scheduler_app.models import manual_occurrence_id
    from scheduler_app.postgres.trigger import _statement

    statement = _statement(False)
    with psycopg.connect(f"{pg_conninfo()} dbname={dbname}", autocommit=True, prepare_threshold=0) as conn:

        def call() -> None:
            now = datetime.now(UTC)
            values = {
                "occurrence_id": manual_occurrence_id(TASK, None, now),
                "task_id": TASK,
                "trigger_source": "bench",
                "idempotency_key": None,
                "payload_hash": "",
                "due_at": now,
                "now": now,
                "params": Jsonb({}),
                "reason": "triggered by bench",
            }
            if conn.execute(statement, values).fetchone() is None:
                raise SystemExit("trigger from psycopg: a call inserted nothing")

        yield call


@contextmanager
def api_trigger() -> Iterator[Callable[[], None]]:
    """scheduler.trigger() itself, through Django's connection at its default settings."""
    from scheduler_app import scheduler

    yield lambda: scheduler.trigger(TASK, source="bench")


def python_trigger_run(args: argparse.Namespace, dbname: str, *, api: bool) -> dict[str, Any]:
    """An empty journal and the task row, then one producer in this process for --seconds, one
    trigger after the other: psycopg alone, or (``api``) trigger(); checked."""
    from scheduler_app.models import Task

    Task.objects.update_or_create(id=TASK, defaults={"name": "No-op", "cron": "0 0 1 1 *"})
    fill(0)
    before = pg_work()
    with api_trigger() if api else psycopg_trigger(dbname) as call:
        calls = 0
        cpu = time.process_time()
        began = time.perf_counter()
        deadline = began + args.seconds
        while time.perf_counter() < deadline:
            call()
            calls += 1
        seconds = time.perf_counter() - began
        cpu = time.process_time() - cpu
    after = pg_work()
    found = counts()
    if found.get("pending", 0) != calls or found["events"] != calls:
        raise SystemExit(f"trigger from Python: {calls} calls, the tables hold {found}")
    return {
        "transactions": calls,
        "latency_ms": round(seconds * 1000 / calls, 3),
        "client_cpu_ms": round(cpu * 1000 / calls, 3),
        "batch": 1,
        "executions_per_second": round(calls / seconds, 1),
        "succeeded": calls,
        "per_execution": per_execution(before, after, calls),
    }


def fill(rows: int) -> None:
    """An empty journal, then ``rows`` pending manual occurrences of one task, due one ms apart."""
    from django.db import connection

    from scheduler_app.models import Execution, ExecutionEvent, ExecutionLog

    execution, event, log = (m._meta.db_table for m in (Execution, ExecutionEvent, ExecutionLog))
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {event}, {log}, {execution} RESTART IDENTITY")
        cursor.execute(
            f"INSERT INTO {execution} (occurrence_id, task_id, task_revision, trigger_type, trigger_source,"
            " idempotency_key, payload_hash, scheduled_for, due_at, params, status, attempt, max_attempts,"
            " owner, execution_token, lease_expires_at, stop_requested, result, error, handler_ref,"
            " created_at, started_at, finished_at, updated_at, log_persistence)"
            " SELECT gen_random_uuid(), %s, 1, 'manual', 'bench', NULL, '', NULL, d, '{}', 'pending', 0, 1,"
            " '', '', NULL, false, NULL, NULL, '', d, NULL, NULL, d, 'pending'"
            " FROM (SELECT now() - interval '1 day' + n * interval '1 millisecond' AS d"
            "       FROM generate_series(1, %s) AS n) AS s",
            [TASK, rows],
        )
        for table in (execution, event, log):
            cursor.execute(f"VACUUM ANALYZE {table}")
        cursor.execute("CHECKPOINT")


def counts() -> dict[str, int]:
    """Executions by status, events and log rows, after a run."""
    from django.db.models import Count

    from scheduler_app.models import Execution, ExecutionEvent, ExecutionLog

    by_status = Execution.objects.order_by().values("status").annotate(n=Count("sequence"))
    out = {row["status"]: row["n"] for row in by_status}
    out["events"] = ExecutionEvent.objects.count()
    out["logs"] = ExecutionLog.objects.count()
    return out


def run_pgbench(
    path: Path, seconds: int, protocol: str, dbname: str, clients: int = 2
) -> dict[str, float] | None:
    """``pgbench -n -c 2 -j 2 -T seconds -M protocol -f path``: its transactions/s, count and latency;
    None when the queue ran dry."""
    argv = [
        pgbench_binary(),
        *f"-n -c {clients} -j {clients} -T {seconds} -M {protocol} -f".split(),
        str(path),
    ]
    argv += ["-h", os.environ.get("PGHOST", "127.0.0.1"), "-p", os.environ.get("PGPORT", "5432")]
    argv += ["-U", "postgres", dbname]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        # A client whose claim found no row aborts (its arrays are empty): the queue ran dry.
        if "malformed array literal" in done.stderr:
            return None
        raise SystemExit(f"pgbench failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    tps = re.search(r"^tps = ([\d.]+)", done.stdout, re.M)
    processed = re.search(r"number of transactions actually processed: (\d+)", done.stdout)
    latency = re.search(r"latency average = ([\d.]+) ms", done.stdout)
    assert tps and processed and latency, done.stdout
    return {
        "tps": float(tps.group(1)),
        "transactions": int(processed.group(1)),
        "latency_ms": float(latency.group(1)),
    }


def one_run(batch: int, args: argparse.Namespace, folder: Path, dbname: str, rate: float) -> dict[str, Any]:
    """Fill, run pgbench once, check what it wrote; again with twice the rows if the queue ran dry."""
    path = folder / f"floor_{batch}.sql"
    path.write_text(script(batch, args.protocol))
    rows = int(rate * args.seconds * 2)
    while True:
        fill(rows)
        before = pg_work()
        out = run_pgbench(path, args.seconds, args.protocol, dbname)
        after = pg_work()
        found = counts()
        if out is not None and found.get("pending", 0) > 0:
            break
        print(f"  batch {batch}: {rows} rows ran out; again with {rows * 2}")
        rows *= 2
    succeeded = found.get("success", 0)
    expected = out["transactions"] * batch
    if (
        succeeded != expected
        or found.get("claimed", 0)
        or found.get("running", 0)
        or found["events"] != 3 * succeeded
        or found["logs"] != succeeded
    ):
        raise SystemExit(f"batch {batch}: pgbench counted {expected} executions, the tables hold {found}")
    return {
        **out,
        "batch": batch,
        "executions_per_second": round(out["tps"] * batch, 1),
        "rows_filled": rows,
        "succeeded": succeeded,
        "per_execution": per_execution(before, after, succeeded),
    }


def summarize(runs: list[dict[str, Any]], statements: int = 3) -> dict[str, Any]:
    """Medians over the runs of one variant: executions/s and the database work per execution."""
    out: dict[str, Any] = {
        "executions_per_second": statistics.median(r["executions_per_second"] for r in runs),
        "runs": ", ".join(f"{r['executions_per_second']:,.0f}" for r in runs),
        "statements_sent": statements / runs[0]["batch"],
    }
    for key in runs[0]["per_execution"]:
        out[key] = statistics.median(r["per_execution"][key] for r in runs)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--protocol", choices=["simple", "extended", "prepared"], default="prepared")
    parser.add_argument(
        "--batches",
        default=",".join(map(str, BATCHES)),
        help="the batch sizes to run, comma-separated (e.g. 1,10,32: 32 is a runner's claim at the default"
        " worker count); the first two give the ratio printed last",
    )
    parser.add_argument("--no-trigger", action="store_true", help="leave the trigger floor out")
    parser.add_argument("--shared-pg", action="store_true")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    runs: dict[int, list[dict[str, Any]]] = {batch: [] for batch in batches}
    trigger_runs: list[dict[str, Any]] = []
    psycopg_trigger_runs: list[dict[str, Any]] = []
    api_trigger_runs: list[dict[str, Any]] = []
    with ExitStack() as stack:
        if not args.shared_pg:
            stack.enter_context(private_postgres(port=PORT))
        db = stack.enter_context(bench_database("bench_floor"))
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="floor-")))
        pg_stat_statements_ready()
        for round_ in range(args.repeat):
            for batch in batches:
                rate = max([FIRST_GUESS, *(r["executions_per_second"] for r in runs[batch])])
                r = one_run(batch, args, folder, db.name, rate)
                runs[batch].append(r)
                print(
                    f"round {round_ + 1}, batch {batch}: {r['executions_per_second']:,.0f} executions/s"
                    f" ({r['tps']:,.0f} transactions/s, {r['latency_ms']} ms each);"
                    f" per execution {r['per_execution']}"
                )
            if not args.no_trigger:
                r = trigger_run(args, folder, db.name)
                trigger_runs.append(r)
                print(
                    f"round {round_ + 1}, trigger: {r['executions_per_second']:,.0f} triggers/s"
                    f" ({r['latency_ms']} ms each); per trigger {r['per_execution']}"
                )
                for api, runs_of_it in ((False, psycopg_trigger_runs), (True, api_trigger_runs)):
                    r = python_trigger_run(args, db.name, api=api)
                    runs_of_it.append(r)
                    print(
                        f"round {round_ + 1}, trigger from {'trigger()' if api else 'psycopg'}:"
                        f" {r['executions_per_second']:,.0f} triggers/s ({r['latency_ms']} ms each,"
                        f" {r['client_cpu_ms']} ms of it the client's CPU); per trigger {r['per_execution']}"
                    )
    table = {batch: summarize(runs[batch]) for batch in batches}
    trigger_row = summarize(trigger_runs, statements=1) if trigger_runs else None
    psycopg_row = summarize(psycopg_trigger_runs, statements=1) if psycopg_trigger_runs else None
    api_row = summarize(api_trigger_runs, statements=1) if api_trigger_runs else None
    print()
    print(f"floor, pgbench -c 2 -j 2 -T {args.seconds} -M {args.protocol}, medians of {args.repeat} runs:")
    print(
        "| | executions/s | runs | statements per execution: sent (executed) | commits per execution"
        " | WAL per execution |"
    )
    print("|---|---|---|---|---|---|")
    rows = [("unbatched" if batch == 1 else f"batched by {batch}", row) for batch, row in table.items()]
    if trigger_row is not None and psycopg_row is not None and api_row is not None:
        rows.append(("trigger, 1 client (triggers/s)", trigger_row))
        rows.append(("trigger from Python: psycopg alone, 1 connection (triggers/s)", psycopg_row))
        rows.append(("trigger from Python: trigger() (triggers/s)", api_row))
    for label, row in rows:
        wal = f"{row['wal_bytes'] / 1000:.1f} KB" if "wal_bytes" in row else "-"
        print(
            f"| {label} | {row['executions_per_second']:,.0f} | {row['runs']} | {row['statements_sent']:g}"
            f" ({row.get('statements', '-')}) | {row.get('commits', '-')} | {wal} |"
        )
    if len(batches) > 1:
        first, second = batches[:2]
        ratio = table[second]["executions_per_second"] / table[first]["executions_per_second"]
        print(f"batched by {second} / by {first}: {ratio:.2f}")
    if trigger_row is not None and psycopg_row is not None and api_row is not None:
        psycopg_rate, api_rate = psycopg_row["executions_per_second"], api_row["executions_per_second"]
        print(
            f"trigger from psycopg / pgbench: {psycopg_rate / trigger_row['executions_per_second']:.2f};"
            f" trigger() / psycopg: {api_rate / psycopg_rate:.2f}"
        )
    write_results(
        "floor",
        {
            "seconds": args.seconds,
            "repeat": args.repeat,
            "protocol": args.protocol,
            "clients": 2,
            "medians": {str(batch): row for batch, row in table.items()},
            "runs": {str(batch): runs[batch] for batch in batches},
            "trigger": {"median": trigger_row, "runs": trigger_runs, "script": trigger_script()},
            "trigger_from_psycopg": {"median": psycopg_row, "runs": psycopg_trigger_runs},
            "trigger_from_api": {"median": api_row, "runs": api_trigger_runs},
            "script_batch_10": script(10, args.protocol),
        },
    )


if __name__ == "__main__":
    main()
