"""PostgreSQL without Redis: triggers wake runners through LISTEN/NOTIFY, sent after the commit by a
thread of the triggering process; never behind a transaction-mode pooler."""

from __future__ import annotations

import threading
import time
from collections import deque

import pytest
from django.db import connection, transaction

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
    # A wake-up an earlier test's triggers left to the thread goes out now, before anything listens.
    wakeup._sender.flush()
    wakeup._sender.reset()  # no wake-up sent yet: the next trigger carries one
    yield
    wakeup._sender.flush()


@pytest.fixture
def heard():
    """The channel's notifications in the order of their commits, from a connection of the test's
    own: ``heard()`` is the next one's payload, or None after 5 s."""
    listening = notify.connect()
    listening.execute(f"LISTEN {notify.CHANNEL}")
    received: deque[str] = deque()

    def next_payload() -> str | None:
        deadline = time.monotonic() + 5
        while not received and (left := deadline - time.monotonic()) > 0:
            # Each read takes every notification that arrived together (stop_after would drop some).
            received.extend(n.payload for n in listening.notifies(timeout=min(left, 0.2)))
        return received.popleft() if received else None

    yield next_payload
    listening.close()


@pytest.fixture
def sent(monkeypatch):
    """The wake-ups the sender thread sends on connections of their own (still sent)."""
    sends: list[float] = []
    send = notify.SENDER.send

    def counted() -> None:
        sends.append(time.monotonic())
        send()

    monkeypatch.setattr(notify.SENDER, "send", counted)
    return sends


def marker(payload: str) -> None:
    """A notification committed now, to tell what came before it."""
    with notify.connect() as other:
        other.execute(f"NOTIFY {notify.CHANNEL}, '{payload}'")


def test_a_trigger_carries_its_wake_up_which_postgresql_delivers_at_its_commit(heard, sent):
    scheduler.register(definition(cron="0 0 1 1 *"))
    with transaction.atomic():
        scheduler.trigger("report")
        marker("committed while the trigger was not")
    assert heard() == "committed while the trigger was not"
    assert heard() == ""  # the trigger's, at its commit
    assert sent == []


def test_a_trigger_rolled_back_wakes_no_runner(heard, sent):
    scheduler.register(definition(cron="0 0 1 1 *"))
    with pytest.raises(RuntimeError), transaction.atomic():
        scheduler.trigger("report")
        raise RuntimeError("rolled back")
    marker("after the rollback")
    assert heard() == "after the rollback"
    assert sent == []


def test_the_end_of_a_stream_is_woken_by_the_sender_thread(heard, sent, monkeypatch):
    """The second trigger comes within the spacing of the first's carried wake-up and no trigger
    follows it: the thread sends one for it, on a connection of its own."""
    monkeypatch.setattr(wakeup, "SPACING", 1.0)  # the second comes within it, however slow the machine
    scheduler.register(definition(cron="0 0 1 1 *"))
    before = time.monotonic()
    scheduler.trigger("report")
    scheduler.trigger("report", idempotency_key="second")
    assert heard() == ""
    assert heard() == ""
    assert len(sent) == 1 and sent[0] >= before + wakeup.SPACING


def test_a_stream_is_woken_by_its_own_statements(heard, sent, monkeypatch):
    """A wake-up carried by a later trigger covers those asked for before it: the thread sends none."""
    monkeypatch.setattr(wakeup, "SPACING", 1.0)
    scheduler.register(definition(cron="0 0 1 1 *"))
    scheduler.trigger("report")
    carried = time.monotonic()
    scheduler.trigger("report", idempotency_key="second")  # within the spacing: asks the thread
    wakeup._sender._sent_at -= wakeup.SPACING  # as if the spacing had passed, before the thread sends
    scheduler.trigger("report", idempotency_key="third")  # carries one
    assert [heard(), heard()] == ["", ""]
    # The thread decides at 1.2 spacings after the first: past it, it has sent nothing.
    wait_for(lambda: time.monotonic() >= carried + 2 * wakeup.SPACING, timeout=10)
    marker("later")
    assert heard() == "later"
    assert sent == []


def test_a_long_stream_is_woken_by_its_own_statements_and_the_thread_sends_at_most_its_end(
    heard, sent, monkeypatch
):
    """Triggers for several spacings on end: each spacing one of them carries a wake-up and the
    others ask the thread, which, put off by each carried one, sends at most one, after the last."""
    monkeypatch.setattr(wakeup, "SPACING", 0.2)
    scheduler.register(definition(cron="0 0 1 1 *"))
    began = time.monotonic()
    triggers = 0
    while time.monotonic() < began + 8 * wakeup.SPACING:
        scheduler.trigger("report")
        triggers += 1
    ended = time.monotonic()
    carried = 0
    while heard() is not None:  # each carried wake-up, then the thread's, if it sent one
        carried += 1
    assert triggers > carried >= 4
    assert len(sent) <= 1
    assert all(at >= ended for at in sent)


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
