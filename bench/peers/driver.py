"""The steps of bench/peers/run.py that talk to one system through its own API, in that system's interpreter.

    python -m bench.peers.driver SYSTEM setup WORKLOAD   # tables (migrate / schema); W2: ours registers its task
    python -m bench.peers.driver SYSTEM w1 N DUE          # N tasks due at DUE (unix seconds, a minute)
    python -m bench.peers.driver SYSTEM w2 N              # warm-up, then N triggers; prints JSON

SYSTEM is ours, django-q2 or procrastinate. ours runs with the project's interpreter;
the peers with bench/peers/.venv's. The environment names the database (run.py sets it).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime

from bench._common import wait_until
from bench.noop_hook import read_side_effects

W2_TASK = "w2-noop"
WARMUP = 20
PRODUCER_SECONDS = 300.0  # the trigger loop stops there, whatever is left


def cron_of(due: datetime) -> str:
    return f"{due.minute} {due.hour} {due.day} {due.month} *"


# -- ours ----------------------------------------------------------------------------


def ours_setup(workload: str) -> None:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    if workload == "w2":
        from scheduler_app import scheduler

        scheduler.register({"id": W2_TASK, "name": "No-op", "cron": "0 0 1 1 *", "max_concurrency": 32})


def ours_w1(n: int, due: datetime) -> None:
    import django

    django.setup()
    from scheduler_app.models import Task

    Task.objects.bulk_create(
        [
            Task(id=f"w1-{i:06d}", name=f"W1 {i}", cron=cron_of(due), timezone="", next_run_at=due)
            for i in range(n)
        ],
        batch_size=1000,
    )


def ours_trigger() -> Callable[[str], object]:
    import django

    django.setup()
    from scheduler_app import scheduler

    return lambda occurrence: scheduler.trigger(W2_TASK, source="bench")


# -- django-q2 -----------------------------------------------------------------------


def q2_setup(workload: str) -> None:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def q2_w1(n: int, due: datetime) -> None:
    """Cron schedules (Schedule.CRON) for the due minute; next_run is that minute, as save() would set it."""
    import django

    django.setup()
    from django_q.models import Schedule

    Schedule.objects.bulk_create(
        [
            Schedule(
                name=f"w1-{i:06d}",
                func="bench.peers.q2_tasks.noop",
                args=repr(f"w1-{i:06d}"),
                schedule_type=Schedule.CRON,
                cron=cron_of(due),
                next_run=due,
                repeats=-1,
                intended_date_kwarg="due",
            )
            for i in range(n)
        ],
        batch_size=1000,
    )


def q2_trigger() -> Callable[[str], object]:
    import django

    django.setup()
    from django_q.tasks import async_task

    return lambda occurrence: async_task("bench.peers.q2_tasks.noop", W2_TASK, occurrence=occurrence)


# -- Procrastinate -------------------------------------------------------------------


def procrastinate_setup(workload: str) -> None:
    from bench.peers.procrastinate_app import app

    with app.open():
        app.schema_manager.apply_schema()


def procrastinate_w1(n: int, due: datetime) -> None:
    """Nothing to store: the periodic tasks are declared by the workers' environment (procrastinate_app)."""


def procrastinate_trigger() -> Callable[[str], object]:
    from bench.peers.procrastinate_app import app, noop

    app.open()  # closed when the process exits
    return lambda occurrence: noop.defer(task_id=W2_TASK, occurrence=occurrence)


# -- the commands ----------------------------------------------------------------------

SYSTEMS = {
    "ours": (ours_setup, ours_w1, ours_trigger),
    "django-q2": (q2_setup, q2_w1, q2_trigger),
    "procrastinate": (procrastinate_setup, procrastinate_w1, procrastinate_trigger),
}


def w2(make_trigger: Callable[[], Callable[[str], object]], n: int) -> dict[str, float]:
    """WARMUP triggers and their executions, then n triggers in a loop as fast as the API returns."""
    trigger = make_trigger()
    folder = os.environ["BENCH_SIDE_EFFECTS"]
    for i in range(WARMUP):
        trigger(f"warmup-{i:02d}")
    wait_until(lambda: len(read_side_effects(folder)) >= WARMUP, 60, 0.05)
    deadline = time.monotonic() + PRODUCER_SECONDS
    first = time.time()
    sent = 0
    for i in range(n):
        if time.monotonic() > deadline:
            break
        trigger(f"w2-{i:06d}")
        sent += 1
    return {"first": first, "produced": time.time(), "sent": sent}


def main(argv: list[str]) -> None:
    system, action, *rest = argv
    setup, add_w1, make_trigger = SYSTEMS[system]
    if action == "setup":
        setup(rest[0])
    elif action == "w1":
        add_w1(int(rest[0]), datetime.fromtimestamp(int(rest[1]), UTC))
    elif action == "w2":
        print(json.dumps(w2(make_trigger, int(rest[0]))))
    else:
        raise SystemExit(f"unknown action {action}")


if __name__ == "__main__":
    main(sys.argv[1:])
