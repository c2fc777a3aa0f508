"""Clocks: the runner's view of "now", kept in step with the database clock."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime: ...

    def observe(self, database_now: datetime) -> None: ...


class DatabaseClock:
    """Node time corrected by the offset to the database clock seen at the last probe.

    Every node compares leases and due times against the same (database) clock,
    whatever the skew between their own clocks.
    """

    def __init__(self) -> None:
        self._offset = timedelta(0)

    def now(self) -> datetime:
        return datetime.now(UTC) + self._offset

    def observe(self, database_now: datetime) -> None:
        self._offset = database_now - datetime.now(UTC)


class FakeClock:
    """A clock tests move by hand."""

    def __init__(self, start: datetime) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def observe(self, database_now: datetime) -> None:
        pass

    def advance(self, seconds: float) -> datetime:
        with self._lock:
            self._now += timedelta(seconds=seconds)
            return self._now

    def set(self, value: datetime) -> None:
        with self._lock:
            self._now = value
