"""Wake-ups: a trigger wakes idle runners at once instead of at the next tick.

Through Redis when REDIS_URL is set, else through PostgreSQL's LISTEN/NOTIFY when the journal is
on PostgreSQL (``postgres/notify.py``); on other databases runners find work at their next tick.
Wake-ups only speed things up; when Redis or the notifications are down, runners still find
work at their next tick.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import threading
import time
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from scheduler_app.conf import scheduler_settings

logger = logging.getLogger("scheduler_app")

CHANNEL = "scheduler_app:wake"
RETRY_SECONDS = 5.0


def redis_location(url: str | None = None) -> str:
    """The Redis URL without its user name and password, for messages."""
    parts = urlsplit(url if url is not None else str(scheduler_settings.REDIS_URL or ""))
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    if not netloc:
        return f"{parts.scheme}://{parts.path}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def redis_error(exc: BaseException) -> str:
    """The error's kind and redis-py's message: addresses and errno, never the URL's password."""
    text = str(exc).replace(str(scheduler_settings.REDIS_URL or ""), redis_location())
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


class _Outage:
    """Logs a Redis outage once when it starts (WARNING, with the cause) and once when it ends."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._down = False

    def failed(self, exc: BaseException) -> None:
        if self._down:
            logger.debug(
                "%s: redis at %s still unreachable (%s)", self._what, redis_location(), redis_error(exc)
            )
            return
        self._down = True
        logger.warning(
            "%s: redis at %s unreachable (%s); runners see work at their next tick instead",
            self._what,
            redis_location(),
            redis_error(exc),
        )

    def succeeded(self) -> None:
        if self._down:
            self._down = False
            logger.warning("%s: redis at %s reachable again", self._what, redis_location())


_publish_outage = _Outage("wake-ups not sent")


def _client() -> Any:
    import redis

    return redis.Redis.from_url(
        scheduler_settings.REDIS_URL, socket_timeout=0.5, socket_connect_timeout=0.5, health_check_interval=30
    )


_publishers: dict[str, Any] = {}
_publishers_lock = threading.Lock()


def _publisher() -> Any:
    """One client per URL and process: its pool keeps the connection, so a wake-up is one round trip."""
    url = scheduler_settings.REDIS_URL
    with _publishers_lock:
        if url not in _publishers:
            _publishers[url] = _client()
        return _publishers[url]


# After a wake-up, the next waits this long: as often as a runner starts ticks for a stream of
# them (runner.loop.TRIGGER_GATHER), so a stream sends at most about 10 a second.
SPACING = 0.1


class _Sender:
    """Publishes wake-ups from a thread of its own, so a trigger never waits for Redis.

    ``notify`` only raises a flag. The thread clears it before each publish, so a wake-up
    asked for after a trigger committed goes out after that commit, and every wake-up asked
    for while one is on its way goes out as one. Started on first use in each process; a
    wake-up still pending at exit is sent then.

    On PostgreSQL a trigger's own statement carries the wake-up when none went out for SPACING
    (``carry``), so a stream of triggers opens no connection for its wake-ups: the thread waits
    a little past the spacing and sends only for triggers that no later carried wake-up
    covered, those at the end of a stream.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget the thread: a forked child starts its own (and never waits on a lock the
        parent's threads held at the fork)."""
        self.pending = threading.Event()
        self._pid = 0
        self._lock = threading.Lock()
        self._sending = threading.Lock()  # held by the thread from a request to its send
        # Monotonic times of the last wake-up sent (by the thread or carried) and the last request.
        self._sent_at = -math.inf
        self._requested_at = -math.inf

    def carry(self) -> bool:
        """Whether the caller's statement is to carry a wake-up; it counts as sent from now."""
        now = time.monotonic()
        if now - self._sent_at < SPACING:
            return False
        self._sent_at = now
        return True

    def request(self) -> None:
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    threading.Thread(target=self._run, name="scheduler-wake-sender", daemon=True).start()
                    self._pid = os.getpid()
        self._requested_at = time.monotonic()
        self.pending.set()

    def _run(self) -> None:
        pending = self.pending
        while True:
            pending.wait()
            with self._sending:
                pending.clear()
                self._send_unless_covered()

    def _send_unless_covered(self) -> None:
        """Send the wake-up asked for, unless one sent or carried since the last request covers it."""
        # Past the spacing by a fifth: time for the next trigger of a stream to carry it. Each
        # wake-up a trigger carries meanwhile puts the send off again, so that while a stream goes
        # on its own statements wake the runners, and the thread sends at most one, at its end.
        while (left := self._sent_at + SPACING * 1.2 - time.monotonic()) > 0:
            time.sleep(left)
        if self._sent_at > self._requested_at:
            return
        self._sent_at = time.monotonic()
        _publish()

    def flush(self) -> None:
        """Send a wake-up still pending, after the one under way (at exit, and before a test
        database is dropped: no connection of the thread's is left open after this)."""
        if self._pid != os.getpid() or not self._sending.acquire(timeout=5):
            return
        try:
            if self.pending.is_set():
                self.pending.clear()
                self._sent_at = time.monotonic()  # the thread, woken by it meanwhile, sends no other
                _publish()
        finally:
            self._sending.release()


_sender = _Sender()
atexit.register(_sender.flush)
os.register_at_fork(after_in_child=_sender.reset)


def _database_wake_ups() -> Any:
    """The journal database's own wake-ups (PostgreSQL's LISTEN/NOTIFY), or None."""
    from scheduler_app.statements import journal_statements

    return journal_statements().wake_ups()


def carry() -> bool:
    """Whether a trigger's own statement is to send the wake-up (PostgreSQL's NOTIFY, delivered at
    its commit) instead of ``notify``: on PostgreSQL without Redis, at most once per SPACING."""
    return not scheduler_settings.REDIS_URL and _database_wake_ups() is not None and _sender.carry()


def notify() -> None:
    """Wake runners soon after this call; never fails or delays the caller."""
    if scheduler_settings.REDIS_URL or _database_wake_ups() is not None:
        _sender.request()


def _publish() -> None:
    if not scheduler_settings.REDIS_URL:
        database = _database_wake_ups()
        if database is not None:
            database.SENDER.send()
        return
    try:
        _publisher().publish(CHANNEL, b"1")
    except Exception as exc:
        _publish_outage.failed(exc)
    else:
        _publish_outage.succeeded()


class Waker(Protocol):
    """What a runner listens with: ``heard`` is set with its wake event when a trigger woke it."""

    heard: threading.Event

    def stop(self) -> None: ...


def start_listener(wake: threading.Event) -> Waker | None:
    """Listen for wake-ups, through Redis or PostgreSQL (see the module's docstring); None: ticks only."""
    if scheduler_settings.REDIS_URL:
        return Listener.start_if_configured(wake)
    database = _database_wake_ups()
    if database is None:
        return None
    listener: Waker = database.Listener(wake)
    listener.start()  # type: ignore[attr-defined]
    return listener


def description(tick_interval: float) -> str:
    """How a runner hears of triggers, for its start-up line."""
    if scheduler_settings.REDIS_URL:
        return f"Redis wake-ups from {redis_location()}"
    if _database_wake_ups() is not None:
        return "PostgreSQL LISTEN/NOTIFY wake-ups"
    return f"no wake-ups (work is found by ticks every {tick_interval:g}s)"


class Listener(threading.Thread):
    """Sets ``wake`` whenever a wake-up arrives on the Redis channel; reconnects after errors."""

    def __init__(self, wake: threading.Event) -> None:
        super().__init__(name="scheduler-redis-listener", daemon=True)
        self._wake = wake
        # Set with ``wake`` when the wake-up came from a trigger; the runner clears it.
        self.heard = threading.Event()
        self._stop_event = threading.Event()
        self._outage = _Outage("runner not woken by triggers")

    @classmethod
    def start_if_configured(cls, wake: threading.Event) -> Listener | None:
        if not scheduler_settings.REDIS_URL:
            return None
        listener = cls(wake)
        listener.start()
        return listener

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                pubsub = _client().pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(CHANNEL)
                self._outage.succeeded()
                try:
                    while not self._stop_event.is_set():
                        if pubsub.get_message(timeout=0.5) is not None:
                            self.heard.set()
                            self._wake.set()
                finally:
                    pubsub.close()
            except Exception as exc:
                self._outage.failed(exc)
                self._stop_event.wait(RETRY_SECONDS)

    def stop(self) -> None:
        self._stop_event.set()
