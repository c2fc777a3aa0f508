"""Fault injection on real runner processes: crashes and lost connections at precise points.

The faults are installed in the runner subprocesses only (tests/system/faults.py,
SCHEDULER_FAULT); the product code runs unchanged. Outcomes are read from the
journal and from the hook's side-effect files.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime

import pytest
from django.db import connection

from scheduler_app import scheduler
from scheduler_app.models import Execution, ExecutionLog, LogPersistence, Runner, Status
from tests.factories import definition, ran_once, transitions
from tests.system.faults import (  # noqa: F401 - runners is a fixture
    BrokenRedis,
    FaultyRunner,
    kill_other_connections,
    other_connections,
    reached,
    release,
)
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor == "sqlite", reason="process tests need PostgreSQL or MariaDB"),
]

NEVER = "0 0 1 1 *"


def execution_of(occurrence_id) -> Execution:
    return Execution.objects.get(occurrence_id=occurrence_id)


def status_of(occurrence_id) -> str:
    return execution_of(occurrence_id).status


def last_seen(node_id: str) -> datetime | None:
    return Runner.objects.filter(node_id=node_id).values_list("last_seen_at", flat=True).first()


def wait_for_renewals(node_id: str, count: int = 2, timeout: float = 15) -> None:
    """Wait until a runner has refreshed its heartbeat ``count`` more times (it is still ticking)."""
    for _ in range(count):
        before = last_seen(node_id)
        wait_for(lambda before=before: last_seen(node_id) not in (None, before), timeout=timeout)


# 1 -------------------------------------------------------------------------------


def test_sigkill_after_the_claim_before_the_start_is_reclaimed_and_runs_once(runners):
    scheduler.register(definition(cron=NEVER, idempotent=False))
    victim = runners.start("victim", fault="pause_before_start")
    execution = scheduler.trigger("report", params={"result": "once"})
    occurrence = str(execution.occurrence_id)
    wait_for(lambda: runners.reached("pause_before_start") == occurrence, message="claim")
    claimed = execution_of(occurrence)
    assert (claimed.status, claimed.owner, claimed.attempt) == (Status.CLAIMED, "victim", 1)
    assert runners.starts() == Counter()

    victim.kill()
    survivor = runners.start("survivor")
    wait_for(lambda: status_of(occurrence) == Status.SUCCESS, timeout=20)

    assert runners.starts() == ran_once("report", occurrence)
    done = execution_of(occurrence)
    assert (done.attempt, done.owner, done.result) == (1, "survivor", "once")
    moves = transitions(occurrence)
    released = moves.index((Status.CLAIMED, Status.PENDING))
    assert moves[released:] == [
        (Status.CLAIMED, Status.PENDING),
        (Status.PENDING, Status.CLAIMED),
        (Status.CLAIMED, Status.RUNNING),
        (Status.RUNNING, Status.SUCCESS),
    ]
    assert survivor.stop() == 0


# 2 -------------------------------------------------------------------------------


@pytest.mark.parametrize("idempotent", [False, True], ids=["not-idempotent", "idempotent"])
def test_sigkill_after_the_handler_returned_before_the_outcome_was_written(runners, idempotent):
    scheduler.register(definition(cron=NEVER, idempotent=idempotent, retry={"max_attempts": 2}))
    victim = runners.start("victim", fault="pause_after_handler")
    execution = scheduler.trigger("report")
    occurrence = str(execution.occurrence_id)
    wait_for(lambda: runners.reached("pause_after_handler") == occurrence, message="handler return")
    running = execution_of(occurrence)
    assert (running.status, running.attempt, running.result) == (Status.RUNNING, 1, None)
    assert runners.starts() == ran_once("report", occurrence)

    victim.kill()
    survivor = runners.start("survivor")
    if not idempotent:
        wait_for(lambda: status_of(occurrence) == Status.UNKNOWN, timeout=20)
        wait_for_renewals("survivor", 3)
        assert runners.starts() == ran_once("report", occurrence)
        unknown = execution_of(occurrence)
        assert (unknown.attempt, unknown.result, unknown.error["reason"]) == (1, None, "lease expired")
    else:
        wait_for(lambda: status_of(occurrence) == Status.SUCCESS, timeout=20)
        assert runners.starts() == ran_once("report", occurrence, 1, 2)
        rerun = execution_of(occurrence)
        assert (rerun.attempt, rerun.owner, rerun.result) == (2, "survivor", {"ok": True, "attempt": 2})
    assert Execution.objects.filter(task_id="report").count() == 1
    assert survivor.stop() == 0


# 3 -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "point",
    ["pause_before_finish_update", "pause_before_finish_commit"],
    ids=["before-update", "before-commit"],
)
def test_connections_killed_inside_the_finish_write(runners, point):
    scheduler.register(definition(cron=NEVER, idempotent=False))
    scheduler.register(definition("later", cron=NEVER))
    runner = runners.start("resilient", fault=point)
    execution = scheduler.trigger("report", params={"result": "done"})
    occurrence = str(execution.occurrence_id)
    wait_for(lambda: runners.reached(point), message="finish write")
    # Before the commit nothing of the outcome is visible.
    assert status_of(occurrence) == Status.RUNNING
    assert kill_other_connections() >= 1
    runners.release(point)

    final = wait_for(
        lambda: (row := execution_of(occurrence)).status in (Status.SUCCESS, Status.UNKNOWN) and row,
        timeout=20,
    )
    if final.status == Status.SUCCESS:
        assert final.result == "done"
    else:
        assert final.error["reason"] == "lease expired"

    later = scheduler.trigger("later", params={"result": "later"}, wait=30)
    assert (later.status, later.result) == (Status.SUCCESS, "later")
    assert runner.alive
    assert runners.starts() == ran_once("report", occurrence) + ran_once("later", later.occurrence_id)
    assert status_of(occurrence) == final.status
    assert runner.stop() == 0


def test_an_outcome_recorded_alone_after_a_lost_connection_still_gets_its_log(runners):
    scheduler.register(definition(cron=NEVER, idempotent=False))
    runners.start("resilient", fault="pause_before_finish_commit")
    execution = scheduler.trigger("report", params={"result": "done"})
    occurrence = str(execution.occurrence_id)
    wait_for(lambda: runners.reached("pause_before_finish_commit"), message="finish write")
    assert kill_other_connections() >= 1
    runners.release("pause_before_finish_commit")
    # The retry of the outcome alone succeeds on a fresh connection ...
    wait_for(lambda: status_of(occurrence) == Status.SUCCESS, timeout=20)
    # ... and the log row should follow it, as on every other path where it is written apart.
    wait_for(lambda: execution_of(occurrence).log_persistence == LogPersistence.PERSISTED, timeout=5)
    log = ExecutionLog.objects.get(occurrence_id=occurrence)
    assert (log.status, log.attempt, log.result) == (Status.SUCCESS, 1, "done")


def test_an_attempt_on_a_worker_whose_idle_connection_was_dropped_starts_at_once(runners):
    scheduler.register(definition(cron=NEVER))
    runner = runners.start("stale", "--workers", "1", lease=30)
    first = scheduler.trigger("report", params={"result": 1}, wait=20)
    assert first.status == Status.SUCCESS
    # An idle-session timeout, a proxy or a failover drops the idle runner's connections.
    assert kill_other_connections() >= 1
    second = scheduler.trigger("report", params={"result": 2}, wait=10)
    assert runner.alive
    assert (second.status, second.result) == (Status.SUCCESS, 2)


# 4 -------------------------------------------------------------------------------


@pytest.mark.parametrize("idempotent", [False, True], ids=["not-idempotent", "idempotent"])
def test_a_poison_task_that_kills_its_runner_ends_unknown(runners, idempotent):
    scheduler.register(definition("poison", cron=NEVER, idempotent=idempotent, retry={"max_attempts": 3}))
    scheduler.register(definition("normal", cron=NEVER))
    supervised = [runners.start("node-0", fault="poison")]
    execution = scheduler.trigger("poison", params={"poison": True})
    occurrence = str(execution.occurrence_id)

    def supervise() -> bool:
        """Restart the runner whenever it dies (at most 6 times); done when the occurrence is unknown."""
        if not supervised[-1].alive:
            assert len(supervised) <= 6, "too many restarts"
            supervised.append(runners.start(f"node-{len(supervised)}", fault="poison"))
        return status_of(occurrence) == Status.UNKNOWN

    wait_for(supervise, timeout=60, interval=0.1)
    crashes = 3 if idempotent else 1
    assert [process.process.returncode for process in supervised[:-1]] == [1] * crashes
    assert runners.starts() == ran_once("poison", occurrence, *range(1, crashes + 1))
    unknown = execution_of(occurrence)
    assert (unknown.attempt, unknown.error["reason"]) == (crashes, "lease expired")

    normal = scheduler.trigger("normal", params={"result": "fine"}, wait=20)
    assert (normal.status, normal.result) == (Status.SUCCESS, "fine")
    survivor = supervised[-1]
    wait_for_renewals(survivor.node_id, 2)
    assert survivor.alive
    assert status_of(occurrence) == Status.UNKNOWN
    assert sum(runners.starts().values()) == crashes + 1
    assert survivor.stop() == 0


# 5 -------------------------------------------------------------------------------


@pytest.mark.skipif(connection.vendor != "mysql", reason="wait_timeout is a MariaDB/MySQL setting")
def test_connections_idle_past_wait_timeout_do_not_stop_the_runner(runners):
    # SESSION wait_timeout set on each of the runner's connections (tests/system/faults.py) rather than
    # GLOBAL: the server is shared, and a global change would hit other suites' connections too.
    scheduler.register(definition(cron=NEVER))
    runner = runners.start("idle", "--tick-interval", "2.5", "--workers", "1", fault="mysql_wait_timeout=1")
    first = scheduler.trigger("report", params={"result": 1}, wait=30)
    assert (first.status, first.result) == (Status.SUCCESS, 1)
    # The server drops the sessions of the idle tick loop and of the idle worker.
    wait_for(lambda: other_connections() == 0, timeout=20, message="idle sessions dropped")
    second = scheduler.trigger("report", params={"result": 2}, wait=45)
    assert (second.status, second.result) == (Status.SUCCESS, 2)
    assert runner.alive
    both = ran_once("report", first.occurrence_id) + ran_once("report", second.occurrence_id)
    assert runners.starts() == both
    assert runner.stop() == 0


# 6 -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["close", "silent"])
def test_a_broken_redis_leaves_the_runner_polling(runners, settings, mode):
    server = BrokenRedis(mode)
    try:
        scheduler.register(definition(cron=NEVER))
        runner = runners.start("broken-redis", "--tick-interval", "0.5", SCHEDULER_REDIS_URL=server.url)
        wait_for(lambda: server.accepted >= 1, message="the runner's listener connects")
        settings.SCHEDULER_APP = {**settings.SCHEDULER_APP, "REDIS_URL": server.url}
        for value in (1, 2):
            execution = scheduler.trigger("report", params={"result": value}, wait=20)
            assert (execution.status, execution.result) == (Status.SUCCESS, value)
        assert runner.alive
        assert runner.stop() == 0
    finally:
        server.close()
