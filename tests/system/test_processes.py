"""Real runner processes on PostgreSQL and MariaDB: claims across nodes, SIGKILL, SIGSTOP, SIGTERM, lost connections."""

from __future__ import annotations

import signal
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from scheduler_app import scheduler
from scheduler_app.exceptions import Conflict
from scheduler_app.models import Execution, Runner, Status, Task
from tests.factories import definition, ran_once
from tests.system.processes import RunnerProcess, side_effect_lines, starts
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor == "sqlite", reason="multi-node tests need PostgreSQL or MariaDB"),
]


@pytest.fixture
def runners(tmp_path):
    started: list[RunnerProcess] = []

    def start(node_id: str, *args: str, **options) -> RunnerProcess:
        process = RunnerProcess(tmp_path, node_id, "--tick-interval", "0.2", *args, **options)
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()


def execution_of(occurrence_id) -> Execution:
    return Execution.objects.get(occurrence_id=occurrence_id)


def last_seen(node_id: str) -> datetime | None:
    return Runner.objects.filter(node_id=node_id).values_list("last_seen_at", flat=True).first()


def wait_for_renewals(node_id: str, count: int = 2, timeout: float = 30) -> None:
    """Wait until a runner has refreshed its heartbeat ``count`` more times (it is ticking)."""
    for _ in range(count):
        before = last_seen(node_id)
        wait_for(lambda before=before: last_seen(node_id) not in (None, before), timeout=timeout)


@pytest.mark.minute
def test_three_runners_run_each_due_minute_of_300_tasks_exactly_once(runners, tmp_path):
    Task.objects.bulk_create(
        Task(id=f"t{i:03d}", name="t", cron="* * * * *", next_run_at=_next_minute()) for i in range(300)
    )
    processes = [runners(f"node-{n}", "--workers", "8") for n in range(3)]
    first_minute = _next_minute()
    # Two real minute boundaries: every task fires twice, each occurrence runs once.
    wait_for(
        lambda: (
            Execution.objects.filter(scheduled_for__gt=first_minute, status=Status.SUCCESS).count() == 300
        ),
        timeout=200,
        interval=0.5,
    )
    wait_for(lambda: len(starts(tmp_path)) >= 600, timeout=30)
    for process in processes:
        assert process.stop() == 0
    started = starts(tmp_path)
    assert max(started.values()) == 1
    occurrences = list(
        Execution.objects.filter(status=Status.SUCCESS).values_list(
            "task_id", "scheduled_for", "occurrence_id"
        )
    )
    assert len({(task_id, minute) for task_id, minute, _ in occurrences}) == len(occurrences)
    # Each occurrence the journal holds ran exactly once, and nothing else ran.
    assert started == sum(
        (ran_once(task_id, occurrence) for task_id, _, occurrence in occurrences), Counter()
    )
    # Every task ran at the two minutes waited for, and at a third if it came before the runners stopped.
    per_task = Counter(task_id for task_id, _, _ in occurrences)
    assert len(per_task) == 300 and set(per_task.values()) <= {2, 3}
    assert not Execution.objects.exclude(status=Status.SUCCESS).exists()
    owners = set(Execution.objects.values_list("owner", flat=True))
    assert len(owners) >= 2, "the work should spread over several runners"


def terminate_other_connections() -> None:
    """Drop every other connection to the test database, as a failover or an admin would."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return
        cursor.execute(
            "SELECT id FROM information_schema.processlist WHERE db = DATABASE() AND id <> CONNECTION_ID()"
        )
        for (thread_id,) in cursor.fetchall():
            cursor.execute(f"KILL {int(thread_id)}")


def _next_minute() -> datetime:
    now = datetime.now(UTC)
    return now.replace(second=0, microsecond=0) + timedelta(minutes=1)


@pytest.mark.parametrize("idempotent", [False, True])
def test_sigkill_during_a_hook_gives_unknown_or_a_rerun_as_attempt_two(runners, tmp_path, idempotent):
    scheduler.register(definition(cron="0 0 1 1 *", idempotent=idempotent, retry={"max_attempts": 2}))
    victim = runners("victim", lease=2)
    execution = scheduler.trigger("report", params={"block": 600})
    wait_for(lambda: execution_of(execution.occurrence_id).status == Status.RUNNING)
    wait_for(lambda: side_effect_lines(tmp_path))
    victim.signal(signal.SIGKILL)
    victim.kill()
    survivor = runners("survivor", lease=2)
    if not idempotent:
        wait_for(lambda: execution_of(execution.occurrence_id).status == Status.UNKNOWN, timeout=15)
        wait_for_renewals("survivor", 2)
        assert starts(tmp_path) == ran_once("report", execution.occurrence_id)
        unknown = execution_of(execution.occurrence_id)
        with pytest.raises(Conflict):
            scheduler.executions.resolve_unknown(
                unknown.occurrence_id,
                "success",
                expected_updated_at=unknown.updated_at - timedelta(seconds=1),
            )
        resolved = scheduler.executions.resolve_unknown(
            unknown.occurrence_id, "success", expected_updated_at=unknown.updated_at
        )
        assert resolved.status == Status.SUCCESS
    else:
        wait_for(lambda: len(starts(tmp_path)) == 2, timeout=15)
        assert starts(tmp_path) == ran_once("report", execution.occurrence_id, 1, 2)
        rerun = execution_of(execution.occurrence_id)
        assert (rerun.attempt, rerun.owner) == (2, "survivor")
    assert survivor.stop() == 0


def test_a_runner_stopped_past_its_lease_writes_nothing_when_it_resumes(runners, tmp_path):
    scheduler.register(definition(cron="0 0 1 1 *"))
    sleeper = runners("sleeper", lease=2)
    execution = scheduler.trigger("report", params={"block": 3, "ignore_cancel": True})
    wait_for(lambda: side_effect_lines(tmp_path))
    sleeper.signal(signal.SIGSTOP)
    runners("other", lease=2)
    wait_for(lambda: execution_of(execution.occurrence_id).status == Status.UNKNOWN, timeout=15)
    frozen = execution_of(execution.occurrence_id)
    events = list(frozen.events.values_list("id", flat=True))
    sleeper.signal(signal.SIGCONT)
    wait_for(lambda: any(line.endswith(",end") for line in side_effect_lines(tmp_path)), timeout=15)
    assert sleeper.stop() == 0  # drains its worker: the late finish has been attempted
    after = execution_of(execution.occurrence_id)
    assert (after.status, after.updated_at, after.result) == (Status.UNKNOWN, frozen.updated_at, None)
    assert list(after.events.values_list("id", flat=True)) == events


def test_sigterm_interrupts_in_flight_attempts_and_exits_zero(runners, tmp_path):
    scheduler.register(definition(cron="0 0 1 1 *", retry={"max_attempts": 3}))
    runner = runners("graceful")
    execution = scheduler.trigger("report", params={"block": 600})
    wait_for(lambda: execution_of(execution.occurrence_id).status == Status.RUNNING)
    assert runner.stop(timeout=20) == 0
    stopped = execution_of(execution.occurrence_id)
    assert (stopped.status, stopped.attempt, stopped.error["message"]) == (Status.INTERRUPTED, 1, "shutdown")
    assert Runner.objects.get(node_id="graceful").stopped_at is not None


def test_a_second_signal_exits_at_once(runners, tmp_path):
    scheduler.register(definition(cron="0 0 1 1 *"))
    runner = runners("stubborn")
    execution = scheduler.trigger("report", params={"block": 600, "ignore_cancel": True})
    wait_for(lambda: execution_of(execution.occurrence_id).status == Status.RUNNING)
    runner.signal(signal.SIGTERM)
    wait_for(lambda: "draining" in runner.output())
    runner.signal(signal.SIGTERM)
    assert runner.process.wait(10) != 0


def test_runner_survives_terminated_database_connections(runners, tmp_path):
    scheduler.register(definition(cron="0 0 1 1 *"))
    runner = runners("resilient")
    first = scheduler.trigger("report", params={"result": 1}, wait=20)
    assert first.status == Status.SUCCESS
    terminate_other_connections()
    second = scheduler.trigger("report", params={"result": 2}, wait=30)
    assert (second.status, second.result) == (Status.SUCCESS, 2)
    assert runner.process.poll() is None
    assert runner.stop() == 0


def test_redis_wakes_an_idle_runner_at_once(runners, settings):
    import redis

    from scheduler_app.wakeup import CHANNEL

    scheduler.register(definition(cron="0 0 1 1 *"))
    redis_url = "redis://127.0.0.1:6379/0"
    client = redis.Redis.from_url(redis_url)
    subscribers_before = dict(client.pubsub_numsub(CHANNEL)).get(CHANNEL.encode(), 0)
    runners("awake", "--tick-interval", "300", SCHEDULER_REDIS_URL=redis_url)
    wait_for(lambda: dict(client.pubsub_numsub(CHANNEL)).get(CHANNEL.encode(), 0) > subscribers_before)
    wait_for(lambda: last_seen("awake"))
    settings.SCHEDULER_APP = {**settings.SCHEDULER_APP, "REDIS_URL": redis_url}
    # With a 300 s tick, only the wake-up can make this run within the wait.
    execution = scheduler.trigger("report", params={"result": "woken"}, wait=20)
    assert (execution.status, execution.result) == (Status.SUCCESS, "woken")


def test_a_runner_without_redis_still_runs_triggers_at_its_next_tick(runners, settings):
    scheduler.register(definition(cron="0 0 1 1 *"))
    dead_redis = "redis://127.0.0.1:1/0"
    runners("no-redis", "--tick-interval", "0.5", SCHEDULER_REDIS_URL=dead_redis)
    settings.SCHEDULER_APP = {**settings.SCHEDULER_APP, "REDIS_URL": dead_redis}
    execution = scheduler.trigger("report", params={"result": "ok"}, wait=20)
    assert execution.status == Status.SUCCESS
