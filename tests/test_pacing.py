"""When a threaded runner wakes: at known due instants, and at most one statement per idle tick interval."""

from __future__ import annotations

import os
import threading
import time

import pytest
from django.db import connection, transaction
from django.db.backends import utils

from scheduler_app import scheduler, wakeup
from scheduler_app.models import Execution, Status, Task
from scheduler_app.runner.loop import TRIGGER_GATHER
from tests.conftest import RUNNER_THREAD
from tests.factories import definition
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def runner_statements(monkeypatch):
    """Statements sent by the runner's own thread (not its workers), as a list of SQL strings."""
    sent: list[str] = []
    original = utils.CursorWrapper.execute
    # A runner an earlier test could not stop in time still ticks under the same thread name.
    leftovers = {thread.ident for thread in threading.enumerate() if thread.name == RUNNER_THREAD}

    def execute(self, sql, params=None):
        thread = threading.current_thread()
        if thread.name == RUNNER_THREAD and thread.ident not in leftovers:
            sent.append(sql)
        return original(self, sql, params)

    monkeypatch.setattr(utils.CursorWrapper, "execute", execute)
    return sent


def test_an_idle_runner_sends_at_most_one_statement_per_tick_interval(running, runner_statements):
    for i in range(20):
        scheduler.register(definition(f"idle-{i}", cron="0 0 1 1 *"))
    tick = 0.05
    # A lease of 0.3 s writes the heartbeat every 0.1 s: without pacing that is 1.5 statements per tick.
    running(tick_interval=tick, lease_seconds=0.3)
    wait_for(lambda: len(runner_statements) >= 5)
    start, counted_from = time.monotonic(), len(runner_statements)
    wait_for(lambda: sum("UPDATE" in sql for sql in runner_statements[counted_from:]) >= 20, timeout=30)
    elapsed = time.monotonic() - start
    sent = len(runner_statements) - counted_from
    # Paced, about 41 in these 2 s; unpaced, the heartbeat alone would add half a statement per
    # tick (about 60). The bound leaves room for the window's ends and a few ticks a loaded
    # machine cuts short.
    assert sent <= 1.2 * elapsed / tick + 3, (sent, elapsed)


def test_a_runner_wakes_for_a_retry_at_its_due_instant_not_at_its_next_tick(running):
    scheduler.register(definition(cron="0 0 1 1 *", retry={"max_attempts": 2, "backoff": [1]}))
    execution = scheduler.trigger("report", params={"fail": True})
    running(tick_interval=30)
    wait_for(lambda: Execution.objects.get(sequence=execution.sequence).attempt == 2, timeout=10)
    wait_for(lambda: Execution.objects.get(sequence=execution.sequence).status == Status.FAILED, timeout=10)


@pytest.fixture
def redis_wake_ups(settings):
    redis = pytest.importorskip("redis")
    url = f"redis://127.0.0.1:{os.environ.get('SCHEDULER_TEST_REDIS_PORT', '6379')}/14"
    try:
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
    except redis.RedisError:
        pytest.skip("Redis is not reachable")
    settings.SCHEDULER_APP = {**settings.SCHEDULER_APP, "REDIS_URL": url}


def stream_wake_ups(seconds: float) -> float:
    """Ask for a wake-up every 2 ms for ``seconds``; the time it took."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        wakeup.notify()
        time.sleep(0.002)  # a producer's pace, not a synchronisation
    return time.monotonic() - start


def probes(statements: list[str]) -> int:
    return sum("MIN(next_run_at)" in sql for sql in statements)


def test_a_stream_of_trigger_wake_ups_starts_at_most_one_tick_per_gather_interval(
    running, runner_statements, redis_wake_ups
):
    scheduler.register(definition(cron="0 0 1 1 *"))
    running(tick_interval=30)
    scheduler.trigger("report", wait=10)  # run at once: the listener is subscribed
    before = len(runner_statements)
    elapsed = stream_wake_ups(25 * TRIGGER_GATHER)
    # Each tick here is one probe: a wake-up every 2 ms, at most one tick per TRIGGER_GATHER.
    assert len(runner_statements) - before <= elapsed / TRIGGER_GATHER + 5


def test_a_runner_whose_claims_find_the_due_rows_held_by_another_claim_ticks_half_as_often_again(
    running, runner_statements, redis_wake_ups
):
    """Two runners woken by the same stream then claim in turn instead of colliding at every wake-up."""
    if not connection.features.has_select_for_update_skip_locked:
        pytest.skip("claims here never meet a task locked by another claim")
    scheduler.register(definition(cron="0 0 1 1 *"))
    running(tick_interval=30)
    scheduler.trigger("report", wait=10)  # the listener is subscribed
    waiting = scheduler.trigger("report")
    with transaction.atomic():
        Task.objects.select_for_update().get(id="report")  # as another runner's claim holds it
        before = len(runner_statements)
        elapsed = stream_wake_ups(30 * TRIGGER_GATHER)
        ticks = probes(runner_statements[before:])
        assert Execution.objects.get(sequence=waiting.sequence).status == Status.PENDING
    # One tick per 1.5 gathers (a tick per gather would be 30).
    assert ticks <= elapsed / (1.5 * TRIGGER_GATHER) + 3, ticks


def test_a_runner_that_claimed_claims_again_without_probing_until_the_probe_is_a_quarter_second_old(
    monkeypatch,
):
    from scheduler_app import db
    from scheduler_app.runner import loop

    probes: list[float] = []
    original_probe = db.probe

    def counted_probe():
        probes.append(time.monotonic())
        return original_probe()

    monkeypatch.setattr(db, "probe", counted_probe)
    # The first claim takes as many as two workers hold (CLAIM_AHEAD times two), a second the rest.
    burst = 2 * loop.CLAIM_AHEAD + 2
    scheduler.register(definition("burst", cron="0 0 1 1 *", max_concurrency=burst + 2))
    runner = loop.SchedulerLoop(node_id="pacing", workers=2)
    runner.start()
    try:
        for n in range(burst):
            scheduler.trigger("burst", idempotency_key=str(n))
        probes.clear()
        assert runner.tick()  # probes, then claims what its workers hold
        assert len(probes) == 1
        assert Execution.objects.exclude(status=Status.PENDING).count() == 2 * loop.CLAIM_AHEAD == 16
        # It may claim without probing for a quarter second from that probe; a slow machine must
        # not make the rest of this test outlast that, so the window is widened here.
        assert runner._claim_without_probe_until > 0
        runner._claim_without_probe_until = time.monotonic() + 60
        wait_for(lambda: runner._needs_work())
        assert runner.tick()  # claims the rest without a probe
        assert len(probes) == 1
        wait_for(lambda: Execution.objects.filter(status=Status.SUCCESS).count() == burst)
        # A claim that finds nothing probes, to learn when something comes due next.
        assert not runner.tick()
        assert len(probes) == 2
        # So does a tick once the probe is older than PROBE_REUSE_SECONDS.
        late = scheduler.trigger("burst", idempotency_key="late")
        # The runner's clock is the database's as its last probe saw it, which lags by that
        # probe's round trip: wait until it has reached the trigger's due time.
        wait_for(lambda: runner.clock.now() >= late.due_at)
        runner._claim_without_probe_until = time.monotonic() + 60
        assert runner.tick()
        assert len(probes) == 2
        runner._claim_without_probe_until = time.monotonic() - 0.001
        runner.tick()
        assert len(probes) == 3
    finally:
        runner.shutdown()
        runner.stop()


def test_a_runner_with_more_tasks_to_schedule_probes_at_each_tick(monkeypatch, clock):
    from scheduler_app import db
    from scheduler_app.runner import loop, scheduling

    probes: list[int] = []
    original_probe = db.probe
    monkeypatch.setattr(db, "probe", lambda: probes.append(1) or original_probe())
    monkeypatch.setattr(scheduling, "BATCH", 2)
    for i in range(5):
        scheduler.register(definition(f"minute-{i}", cron="* * * * *", max_concurrency=10))
    runner = loop.SchedulerLoop(node_id="pacing", workers=2, clock=clock)
    runner.start()
    try:
        clock.advance(61)
        probes.clear()
        for _ in range(3):
            runner.tick()
        # Each tick scheduled a batch of two tasks and claimed: the next one probed again.
        assert len(probes) == 3
        assert Execution.objects.filter(trigger_type="scheduled").count() == 5
    finally:
        runner.shutdown()
        runner.stop()


@pytest.fixture
def claims_made(monkeypatch):
    """The runner's claims, as the number of rows each took."""
    from scheduler_app.runner import claims

    made: list[int] = []
    original = claims.claim

    def counting(*args, **kwargs):
        claimed, ended, left_due = original(*args, **kwargs)
        made.append(len(claimed))
        return claimed, ended, left_due

    monkeypatch.setattr(claims, "claim", counting)
    return made


def test_a_runner_with_wake_ups_does_not_tick_again_as_each_attempt_ends_when_its_claim_took_every_due_row(
    running, claims_made, runner_statements, redis_wake_ups
):
    """What ends frees room, not work: the triggers that fill it announce themselves."""
    scheduler.register(definition(cron="0 0 1 1 *", max_concurrency=10))
    running(tick_interval=30, workers=8)
    scheduler.trigger("report", wait=10)  # the listener is subscribed
    before, sent = len(claims_made), len(runner_statements)
    # Ending a tenth of a second apart, each of them apart from the others.
    executions = scheduler.trigger_many("report", [{"params": {"block": 0.1 * n}} for n in range(1, 6)])
    wait_for(
        lambda: (
            Execution.objects.filter(
                sequence__in=[e.sequence for e in executions], status=Status.SUCCESS
            ).count()
            == 5
        ),
        timeout=10,
    )
    # The wake-up's tick claimed the five; a tick as each ended would add a claim or a probe each.
    assert sum(claims_made[before:]) == 5
    ticks = len(claims_made) - before + probes(runner_statements[sent:])
    assert ticks <= 3, (claims_made[before:], probes(runner_statements[sent:]))


def test_a_task_at_its_max_concurrency_has_its_next_row_claimed_as_soon_as_its_slot_ends(
    running, claims_made, redis_wake_ups
):
    """A full task's rows are not among a claim's candidates: the wake-up's claim, finding none,
    does not let a runner ticking every 30 s wait for its next wake-up or tick."""
    scheduler.register(definition(cron="0 0 1 1 *", max_concurrency=1))
    running(tick_interval=30, workers=4)
    scheduler.trigger("report", wait=10)  # the listener is subscribed
    first = scheduler.trigger("report", params={"block": 1})
    wait_for(lambda: Execution.objects.get(sequence=first.sequence).status == Status.RUNNING, timeout=10)
    before = len(claims_made)
    second = scheduler.trigger("report")
    wait_for(lambda: len(claims_made) > before, timeout=10)  # its wake-up's claim, which found no row
    assert Execution.objects.get(sequence=second.sequence).status == Status.PENDING
    wait_for(lambda: Execution.objects.get(sequence=second.sequence).status == Status.SUCCESS, timeout=10)
