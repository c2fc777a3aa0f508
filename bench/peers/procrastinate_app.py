"""Procrastinate's side of bench/peers/run.py: the app, its no-op task and, for W1, its periodic tasks.

W1 uses Procrastinate's periodic tasks: BENCH_PERIODIC_TASKS periodic schedules of the one
no-op task, each with its own periodic_id and task_kwargs, all with the cron
BENCH_PERIODIC_CRON (the due minute). Each worker's periodic deferrer defers them at that
minute; the procrastinate_periodic_defers table keeps the two workers from deferring one twice.
"""

import os

from procrastinate import App, PsycopgConnector

from bench.noop_hook import record

app = App(
    connector=PsycopgConnector(
        conninfo=f"host={os.environ.get('PGHOST', '127.0.0.1')} port={os.environ['PGPORT']}"
        f" user=postgres dbname={os.environ['BENCH_DB_NAME']}"
    )
)


@app.task(name="noop")
async def noop(task_id: str, occurrence: str = "", timestamp: int = 0) -> None:
    # A periodic job gets its due time as ``timestamp``: the occurrence.
    record(task_id, occurrence or f"{task_id}@{timestamp}")


for _i in range(int(os.environ.get("BENCH_PERIODIC_TASKS") or 0)):
    app.periodic(
        cron=os.environ["BENCH_PERIODIC_CRON"],
        periodic_id=f"w1-{_i:06d}",
        task_kwargs={"task_id": f"w1-{_i:06d}"},
    )(noop)
