"""PostgreSQL without Redis: triggers wake runners through LISTEN/NOTIFY, sent after the commit by a
thread of the triggering process; never behind a transaction-mode pooler."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from scheduler_app import scheduler, wakeup
from scheduler_app.models import Status
from scheduler_app.postgres import notify
from tests.factories import definition
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="LISTEN/NOTIFY is PostgreSQL's"),
]


@pytest.fixture(autouse=True)
def no_redis(settings):
    settings.SCHEDULER_APP = {**settings.SCHEDULER_APP, "REDIS_URL": None}
    yield
    wakeup._sender.flush()  # closes the sender's connection before the test database goes


def test_a_trigger_wakes_a_runner_whose_next_tick_is_far_off(running):
    """The runner ticks every 60 s: only the notification can start the claim."""
    scheduler.register(definition(cron="0 0 1 1 *"))
    runner = running(tick_interval=60)
    wait_for(lambda: runner._listener is not None and runner._tick_started > 0)
    listener = runner._listener
    assert isinstance(listener, notify.Listener)
    assert listener.listening.wait(15)
    # The first tick has run; the next is a minute away.
    execution = scheduler.trigger("report", params={"result": "woken"}, wait=15)
    assert (execution.status, execution.result) == (Status.SUCCESS, "woken")


def test_the_listener_hears_each_notification_until_stopped():
    wake = threading.Event()
    listener = wakeup.start_listener(wake)
    assert isinstance(listener, notify.Listener)
    try:
        for _ in range(3):
            wake.clear()
            listener.heard.clear()
            assert woken(wake, listener)
    finally:
        listener.stop()
        listener.join(10)
    assert not listener.is_alive()


def woken(wake: threading.Event, listener: notify.Listener) -> bool:
    """Notify until the listener is woken (the first may go out before it listens)."""
    for _ in range(50):
        wakeup.notify()
        if wake.wait(0.2):
            return listener.heard.is_set()
    return False


def test_no_wake_ups_behind_a_transaction_mode_pooler():
    connection.settings_dict["DISABLE_SERVER_SIDE_CURSORS"] = True
    try:
        assert not notify.available()
        assert wakeup.start_listener(threading.Event()) is None
        assert wakeup.description(1.0) == "no wake-ups (work is found by ticks every 1s)"
    finally:
        connection.settings_dict.pop("DISABLE_SERVER_SIDE_CURSORS", None)


def test_only_a_runner_that_goes_on_ticking_listens(clock):
    """A runner started but not run (tests, --once) holds no listening connection."""
    from tests.factories import inline_runner

    runner = inline_runner(clock)
    assert runner._listener is None
