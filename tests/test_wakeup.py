"""Redis wake-ups: sent from a thread of their own, coalesced, on one kept connection, never an error."""

import logging
import os
import threading
import time

import pytest

from scheduler_app import scheduler, wakeup
from scheduler_app.models import Execution
from tests.factories import definition
from tests.waiting import wait_for

REDIS_URL = "redis://127.0.0.1:6379/15"


def redis_or_skip():
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.RedisError:
        pytest.skip("Redis is not reachable")
    return client


@pytest.fixture
def wake_ups(settings):
    """Messages on the wake-up channel, read as they come: ``next(timeout)`` gives one or None."""
    client = redis_or_skip()
    settings.SCHEDULER_APP = {**settings.SCHEDULER_APP, "REDIS_URL": REDIS_URL}
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(wakeup.CHANNEL)
    pubsub.get_message(timeout=1.0)  # the subscription confirmation

    class Reader:
        redis = client

        def next(self, timeout: float):
            deadline = time.monotonic() + timeout
            while (left := deadline - time.monotonic()) > 0:
                message = pubsub.get_message(timeout=left)
                if message is not None:
                    return message
            return None

    yield Reader()
    pubsub.close()


def test_each_wake_up_reaches_the_channel_on_one_kept_connection(wake_ups):
    wakeup.notify()
    assert wake_ups.next(5) is not None
    before = wake_ups.redis.info("stats")["total_connections_received"]
    for _ in range(20):
        wakeup.notify()
        assert wake_ups.next(5) is not None
    assert wake_ups.redis.info("stats")["total_connections_received"] == before


def test_a_burst_of_wake_ups_goes_out_as_fewer_messages_and_the_next_one_still_arrives(wake_ups):
    for _ in range(500):
        wakeup.notify()
    received = 0
    while wake_ups.next(0.5) is not None:  # until half a second passes without a message
        received += 1
    assert 1 <= received < 500
    wakeup.notify()
    assert wake_ups.next(5) is not None


@pytest.mark.django_db
def test_a_wake_up_to_an_unreachable_redis_is_silent(settings, monkeypatch, caplog):
    """The trigger returns at once with its row written; the publish fails, raises nothing, logs at INFO."""
    settings.SCHEDULER_APP = {**settings.SCHEDULER_APP, "REDIS_URL": "redis://127.0.0.1:1/0"}
    publishes: list[object] = []
    publish = wakeup._publish

    def recorded() -> None:
        try:
            publish()
        except BaseException as exc:  # what would end the sender thread
            publishes.append(exc)
            raise
        publishes.append("returned")

    monkeypatch.setattr(wakeup, "_publish", recorded)
    scheduler.register(definition(cron="0 0 1 1 *"))
    with caplog.at_level(logging.DEBUG, logger="scheduler_app"):
        began = time.monotonic()
        execution = scheduler.trigger("report")
        elapsed = time.monotonic() - began
        wait_for(lambda: publishes, timeout=5, message="the wake-up is published")
        wakeup._sender.flush()  # as at exit: a wake-up still pending is published here
    assert elapsed < 0.5, f"the trigger waited {elapsed:.2f}s for Redis"
    assert Execution.objects.filter(occurrence_id=execution.occurrence_id, status="pending").exists()
    assert set(publishes) == {"returned"}
    records = [record for record in caplog.records if record.name.startswith("scheduler_app")]
    assert max(record.levelno for record in records) == logging.INFO
    assert "redis wake-up not sent" in caplog.text


def test_the_caller_never_publishes_itself(settings, monkeypatch):
    settings.SCHEDULER_APP = {**settings.SCHEDULER_APP, "REDIS_URL": "redis://127.0.0.1:1/0"}
    publishers = []
    monkeypatch.setattr(wakeup, "_publish", lambda: publishers.append(threading.get_ident()))
    wakeup.notify()
    wait_for(lambda: publishers, timeout=5)
    assert threading.get_ident() not in publishers


def test_a_forked_child_starts_a_sender_of_its_own(settings):
    settings.SCHEDULER_APP = {**settings.SCHEDULER_APP, "REDIS_URL": "redis://127.0.0.1:1/0"}
    wakeup.notify()  # this process's sender thread now runs
    with wakeup._sender._lock:  # held by another thread of the parent at the fork
        pid = os.fork()
        if pid == 0:
            # The child inherits neither the thread nor the held lock.
            fresh = wakeup._sender._pid == 0 and wakeup._sender._lock.acquire(blocking=False)
            os._exit(0 if fresh else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
