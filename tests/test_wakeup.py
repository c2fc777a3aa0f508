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

# Pub/sub channels are server-wide: tests/run_all.sh gives its nox sessions a Redis of their own.
REDIS_URL = f"redis://127.0.0.1:{os.environ.get('SCHEDULER_TEST_REDIS_PORT', '6379')}/15"


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
    assert wake_ups.next(20) is not None
    before = wake_ups.redis.info("stats")["total_connections_received"]
    for _ in range(20):
        wakeup.notify()
        assert wake_ups.next(20) is not None
    assert wake_ups.redis.info("stats")["total_connections_received"] == before


def test_a_burst_of_wake_ups_goes_out_as_fewer_messages_and_the_next_one_still_arrives(wake_ups):
    for _ in range(500):
        wakeup.notify()
    assert wake_ups.next(20) is not None
    received = 1
    while wake_ups.next(0.5) is not None:  # until half a second passes without another
        received += 1
    assert received < 500
    wakeup.notify()
    assert wake_ups.next(20) is not None


@pytest.mark.django_db
def test_a_wake_up_to_an_unreachable_redis_never_fails_the_trigger_and_warns_once_with_the_cause(
    settings, monkeypatch, caplog
):
    """The trigger returns with its row written; the publish fails and raises nothing; the outage is one
    warning naming the URL (without its password) and the error, until Redis answers again."""
    settings.SCHEDULER_APP = {**settings.SCHEDULER_APP, "REDIS_URL": "redis://:hunter2@127.0.0.1:1/0"}
    monkeypatch.setattr(wakeup, "_publish_outage", wakeup._Outage("wake-ups not sent"))
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
        execution = scheduler.trigger("report")
        wait_for(lambda: publishes, message="the wake-up is published")
        scheduler.trigger("report", idempotency_key="second")
        wait_for(lambda: len(publishes) == 2, message="the second wake-up is published")
        wakeup._sender.flush()  # as at exit: a wake-up still pending is published here
    assert Execution.objects.filter(occurrence_id=execution.occurrence_id, status="pending").exists()
    assert set(publishes) == {"returned"}
    [warning] = [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert warning.getMessage().startswith(
        "wake-ups not sent: redis at redis://127.0.0.1:1/0 unreachable (ConnectionError: "
    )
    assert "Connection refused" in warning.getMessage()
    assert "hunter2" not in caplog.text


def test_a_runner_whose_redis_is_unreachable_warns_with_the_url_and_the_error(settings, caplog):
    settings.SCHEDULER_APP = {**settings.SCHEDULER_APP, "REDIS_URL": "redis://user:hunter2@127.0.0.1:1/0"}
    wake = threading.Event()
    with caplog.at_level(logging.WARNING, logger="scheduler_app"):
        listener = wakeup.Listener.start_if_configured(wake)
        assert listener is not None
        try:
            wait_for(lambda: caplog.records, timeout=10, message="the listener reports the outage")
        finally:
            listener.stop()
            listener.join(10)
    message = caplog.records[0].getMessage()
    assert message.startswith("runner not woken by triggers: redis at redis://127.0.0.1:1/0 unreachable (")
    assert "Connection refused" in message and "hunter2" not in caplog.text and "user" not in message


def test_the_caller_never_publishes_itself(settings, monkeypatch):
    settings.SCHEDULER_APP = {**settings.SCHEDULER_APP, "REDIS_URL": "redis://127.0.0.1:1/0"}
    publishers = []
    monkeypatch.setattr(wakeup, "_publish", lambda: publishers.append(threading.get_ident()))
    wakeup.notify()
    wait_for(lambda: publishers)
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


def test_a_wake_up_flushed_at_exit_is_not_sent_again_by_the_thread(monkeypatch):
    """At exit (and before a test database is dropped) flush sends what is pending; the thread, woken
    for the same request, must not send it again on a connection of its own afterwards."""
    publishes: list[int] = []  # by thread: an earlier test's sender thread may still publish
    monkeypatch.setattr(wakeup, "_publish", lambda: publishes.append(threading.get_ident()))
    sender = wakeup._Sender()
    # A request the sender's thread was woken for but has not handled yet.
    sender._pid = os.getpid()
    sender._requested_at = time.monotonic()
    sender.pending.set()
    sender.flush()
    sender._send_unless_covered()  # what the thread does next
    assert publishes.count(threading.get_ident()) == 1
