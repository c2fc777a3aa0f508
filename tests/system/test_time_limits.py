"""A real runner process and a hook that ignores its time limit: abandoned, replaced, and a clean exit."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from scheduler_app import scheduler
from scheduler_app.conf import DEFAULTS
from scheduler_app.models import Execution, ExecutionEvent, Status
from tests.factories import definition, ran_once
from tests.system.processes import RunnerProcess, side_effect_lines, starts
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor == "sqlite", reason="process tests need PostgreSQL or MariaDB"),
]

HOOK_TIMEOUT = 2  # seconds; the grace is then 1 s


def test_a_runner_keeps_all_its_workers_after_abandoning_a_stuck_hook_and_exits_zero_on_sigterm(tmp_path):
    for task_id in ("stuck", "left", "right"):
        scheduler.register(definition(task_id, cron="0 0 1 1 *"))
    runner = RunnerProcess(
        tmp_path,
        "limited",
        "--workers",
        "2",
        "--tick-interval",
        "0.2",
        SCHEDULER_HOOK_TIMEOUT=str(HOOK_TIMEOUT),
    )
    try:
        stuck = scheduler.trigger("stuck", params={"block": 600, "ignore_cancel": True})
        wait_for(lambda: Execution.objects.get(sequence=stuck.sequence).status == Status.UNKNOWN, timeout=20)
        stuck.refresh_from_db()
        assert stuck.error["reason"] == "time limit exceeded"
        events = ExecutionEvent.objects.filter(execution_id=stuck.sequence).count()

        # The stuck hook still sleeps in its thread; two tasks of a second each run side by side:
        # the runner has both its workers.
        pair = [scheduler.trigger(task_id, params={"block": 1}) for task_id in ("left", "right")]
        wait_for(
            lambda: all(Execution.objects.get(sequence=e.sequence).status == Status.SUCCESS for e in pair),
            timeout=20,
        )
        left, right = (Execution.objects.get(sequence=e.sequence) for e in pair)
        assert left.started_at < right.finished_at and right.started_at < left.finished_at

        began = time.monotonic()
        assert runner.stop(timeout=DEFAULTS["DRAIN_SECONDS"]) == 0
        assert time.monotonic() - began < DEFAULTS["DRAIN_SECONDS"]
    finally:
        runner.kill()
    assert "drain timed out" not in runner.output()
    stuck.refresh_from_db()
    assert stuck.status == Status.UNKNOWN
    assert ExecutionEvent.objects.filter(execution_id=stuck.sequence).count() == events
    # The stuck hook started once and never returned (no end line).
    assert starts(tmp_path)["stuck," + str(stuck.occurrence_id) + ",1"] == 1
    assert [line for line in side_effect_lines(tmp_path) if line.startswith("stuck,")] == list(
        ran_once("stuck", stuck.occurrence_id)
    )
