"""Prometheus metrics: the view's output, parsed with prometheus-client's own parser, gives the
cluster's figures from the journal, whichever node serves it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from scheduler_app import db, scheduler
from scheduler_app.models import Execution, Runner
from tests.factories import definition

pytestmark = pytest.mark.django_db


def scrape() -> dict[str, Any]:
    response = Client().get("/metrics/")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    samples: dict[str, Any] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            samples[key] = sample.value
    return samples


def value(samples: dict[str, Any], name: str, **labels: str) -> Any:
    return samples[(name, tuple(sorted(labels.items())))]


def test_an_empty_journal_scrapes_to_zeros():
    samples = scrape()
    for status in ("pending", "claimed", "running", "unknown"):
        assert value(samples, "scheduler_executions", status=status) == 0
    assert value(samples, "scheduler_unknown_oldest_age_seconds") == 0
    assert value(samples, "scheduler_runners", state="alive") == 0
    assert value(samples, "scheduler_start_lag_seconds_gcount") == 0


def test_the_figures_of_the_journal(clock):
    now = db.probe().now
    scheduler.register(definition("report", cron="0 0 1 1 *", max_concurrency=10))
    Runner.objects.create(
        node_id="a",
        host="h",
        pid=1,
        started_at=now,
        last_seen_at=now,
        silent_after=now + timedelta(minutes=1),
        version="x",
    )
    made = [scheduler.trigger("report", idempotency_key=str(n)) for n in range(6)]

    def set_row(n: int, **fields: Any) -> None:
        Execution.objects.filter(sequence=made[n].sequence).update(**fields)

    due = now - timedelta(minutes=5)
    set_row(
        0,
        status="success",
        due_at=due,
        started_at=due + timedelta(seconds=0.2),
        finished_at=due + timedelta(seconds=3),
    )
    set_row(
        1,
        status="failed",
        due_at=due,
        started_at=due + timedelta(seconds=7),
        finished_at=due + timedelta(seconds=8),
        log_persistence="persisted",
    )
    set_row(2, status="unknown", updated_at=now - timedelta(seconds=90), finished_at=now)
    set_row(3, status="running", started_at=now)
    set_row(4, due_at=now - timedelta(minutes=10))  # pending, late
    set_row(5, due_at=now)  # pending, on time
    samples = scrape()
    assert value(samples, "scheduler_executions", status="pending") == 2
    assert value(samples, "scheduler_executions", status="running") == 1
    assert value(samples, "scheduler_executions", status="unknown") == 1
    assert value(samples, "scheduler_executions_late") == 1
    assert 90 <= value(samples, "scheduler_unknown_oldest_age_seconds") < 100
    assert value(samples, "scheduler_runners", state="alive") == 1
    assert value(samples, "scheduler_log_failures") == 2  # the success and the unknown: no log rows
    assert (
        value(samples, "scheduler_executions_ended_last_hour", status="success", trigger_type="manual") == 1
    )
    assert value(samples, "scheduler_executions_ended_last_hour", status="failed", trigger_type="manual") == 1
    assert value(samples, "scheduler_start_lag_seconds_bucket", le="0.25") == 1
    assert value(samples, "scheduler_start_lag_seconds_bucket", le="10.0") == 2
    assert value(samples, "scheduler_start_lag_seconds_gcount") == 2
    assert value(samples, "scheduler_duration_seconds_bucket", le="1.0") == 1
    assert value(samples, "scheduler_duration_seconds_gsum") == pytest.approx(3.8)
    # A backfilled occurrence, due a day before it was created: its lag counts from its creation.
    set_row(4, status="success", due_at=now - timedelta(days=1), created_at=now - timedelta(seconds=30))
    Execution.objects.filter(sequence=made[4].sequence).update(
        started_at=now - timedelta(seconds=29), finished_at=now - timedelta(seconds=28)
    )
    samples = scrape()
    assert value(samples, "scheduler_start_lag_seconds_bucket", le="10.0") == 3
    assert value(samples, "scheduler_start_lag_seconds_gcount") == 3


def test_failed_attempts_that_were_retried_count_in_the_attempts_ended(clock):
    """The executions' final statuses hide a failure that a retry made good; the log rows, one per
    attempt, do not."""
    import uuid

    from scheduler_app.models import ExecutionLog, log_id

    now = db.probe().now
    occurrence = uuid.uuid4()
    for attempt, status, ago in [(1, "failed", 50), (2, "success", 40)]:
        ExecutionLog.objects.create(
            id=log_id(occurrence, attempt),
            occurrence_id=occurrence,
            task_id="report",
            trigger_type="scheduled",
            status=status,
            attempt=attempt,
            started_at=now - timedelta(minutes=ago),
            finished_at=now - timedelta(minutes=ago),
        )
    ExecutionLog.objects.create(
        id=log_id(uuid.uuid4(), 1),
        occurrence_id=uuid.uuid4(),
        task_id="report",
        trigger_type="scheduled",
        status="failed",
        attempt=1,
        finished_at=now - timedelta(hours=2),  # before the hour
    )
    samples = scrape()
    assert value(samples, "scheduler_attempts_ended_last_hour", status="failed") == 1
    assert value(samples, "scheduler_attempts_ended_last_hour", status="success") == 1


def test_fire_times_skipped_as_misfires_are_counted(clock):
    from scheduler_app.models import Status, Task
    from scheduler_app.runner import scheduling

    now = db.probe().now
    scheduler.register(definition("report", cron="* * * * *"))
    Task.objects.update(next_run_at=now.replace(second=0, microsecond=0) - timedelta(minutes=10))
    assert value(scrape(), "scheduler_fire_times_missed_last_hour") == 0
    scheduling.schedule_due(now, "node-a")
    record = Execution.objects.get(status=Status.INTERRUPTED)
    assert record.missed_fire_times["count"] >= 8
    assert value(scrape(), "scheduler_fire_times_missed_last_hour") == record.missed_fire_times["count"]


def test_late_follows_each_tasks_own_misfire_grace(clock):
    now = db.probe().now
    scheduler.register(definition("patient", cron="0 0 1 1 *", misfire_grace_seconds=3600))
    scheduler.register(definition("strict", cron="0 0 1 1 *", misfire_grace_seconds=10))
    scheduler.register(definition("default", cron="0 0 1 1 *"))  # the setting's 60 s
    for task_id in ("patient", "strict", "default"):
        execution = scheduler.trigger(task_id)
        Execution.objects.filter(sequence=execution.sequence).update(due_at=now - timedelta(seconds=30))
    assert value(scrape(), "scheduler_executions_late") == 1  # strict's, 30 s past its 10 s
    Execution.objects.update(due_at=now - timedelta(minutes=10))
    assert value(scrape(), "scheduler_executions_late") == 2  # patient's is within its hour


def test_a_scrape_costs_the_same_statements_with_many_tasks(clock):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def statements() -> int:
        with CaptureQueriesContext(connection) as captured:
            scrape()
        return len(captured.captured_queries)

    scheduler.register(definition("t0", cron="0 0 1 1 *", misfire_grace_seconds=30))
    scheduler.trigger("t0")
    few = statements()
    for n in range(1, 40):
        scheduler.register(definition(f"t{n}", cron="* * * * *", misfire_grace_seconds=30 if n % 2 else None))
        scheduler.trigger(f"t{n}")
    assert statements() == few
