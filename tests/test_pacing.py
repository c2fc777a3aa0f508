"""When a threaded runner wakes: at known due instants, and at most one statement per idle tick interval."""

from __future__ import annotations

import threading
import time

import pytest
from django.db.backends import utils

from scheduler_app import scheduler, wakeup
from scheduler_app.engine import TRIGGER_GATHER
from scheduler_app.models import Execution, Status
from tests.conftest import RUNNER_THREAD
from tests.factories import definition
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def runner_statements(monkeypatch):
    """Statements sent by the runner's own thread (not its workers), as a list of SQL strings."""
    sent: list[str] = []
    original = utils.CursorWrapper.execute

    def execute(self, sql, params=None):
        if threading.current_thread().name == RUNNER_THREAD:
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
    wait_for(lambda: sum("UPDATE" in sql for sql in runner_statements[counted_from:]) >= 10, timeout=30)
    elapsed = time.monotonic() - start
    sent = len(runner_statements) - counted_from
    assert sent <= elapsed / tick + 2, (sent, elapsed)


def test_a_runner_wakes_for_a_retry_at_its_due_instant_not_at_its_next_tick(running):
    scheduler.register(definition(cron="0 0 1 1 *", retry={"max_attempts": 2, "backoff": [1]}))
    execution = scheduler.trigger("report", params={"fail": True})
    running(tick_interval=30)
    wait_for(lambda: Execution.objects.get(sequence=execution.sequence).attempt == 2, timeout=10)
    wait_for(lambda: Execution.objects.get(sequence=execution.sequence).status == Status.FAILED, timeout=10)


def test_a_stream_of_trigger_wake_ups_starts_at_most_one_tick_per_gather_interval(
    running, runner_statements, settings
):
    redis = pytest.importorskip("redis")
    url = "redis://127.0.0.1:6379/14"
    try:
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
    except redis.RedisError:
        pytest.skip("Redis is not reachable")
    settings.SCHEDULER_APP = {**settings.SCHEDULER_APP, "REDIS_URL": url}
    scheduler.register(definition(cron="0 0 1 1 *"))
    running(tick_interval=30)
    scheduler.trigger("report", wait=10)  # run at once: the listener is subscribed
    before, start = len(runner_statements), time.monotonic()
    while time.monotonic() - start < 0.5:
        wakeup.notify()
        time.sleep(0.002)  # a producer's pace, not a synchronisation
    elapsed = time.monotonic() - start
    # Each tick here is one probe: ~200 wake-ups, at most one tick per TRIGGER_GATHER.
    assert len(runner_statements) - before <= elapsed / TRIGGER_GATHER + 5
