"""The runner's worker threads: each takes attempts, and what follows their outcomes' commits, from
one queue and runs them; one stuck in a handler past its time limit is replaced (runner/limits.py).

The pool grows with the work, up to its size: a thread starts when work is queued and no thread is
free, and a thread that waited ``idle_seconds`` for work ends (closing its database connections),
so an idle runner holds no worker thread and a busy one as many as its work needs.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from django.db import connections

from scheduler_app.runner.attempt import Attempt

IDLE_SECONDS = 60.0


def _IDLE() -> None:
    """What a thread that waited ``idle_seconds`` for work got instead."""


class WorkerPool:
    """Threads that run attempts; each closes its database connections when it ends."""

    def __init__(
        self, size: int, work: Callable[[Attempt], None], *, idle_seconds: float = IDLE_SECONDS
    ) -> None:
        self.size = size
        self.idle_seconds = idle_seconds
        self._queue: queue.Queue[Attempt | Callable[[], None] | None] = queue.Queue()
        self._work = work
        self._waiting = 0  # threads blocked on the queue
        self._lock = threading.Lock()  # guards the count, the live threads and what they run
        self._threads: list[threading.Thread] = []
        self._running: dict[threading.Thread, Attempt] = {}
        self._started = 0

    def _start_thread(self) -> None:
        thread = threading.Thread(target=self._loop, name=f"scheduler-worker-{self._started}", daemon=True)
        self._started += 1
        self._threads.append(thread)
        thread.start()

    def _loop(self) -> None:
        me = threading.current_thread()
        try:
            while True:
                with self._lock:
                    self._waiting += 1
                try:
                    item = self._queue.get(timeout=self.idle_seconds)
                except queue.Empty:
                    item = _IDLE
                with self._lock:
                    self._waiting -= 1
                    if item is None or (item is _IDLE and self._queue.qsize() == 0):
                        # Asked to stop, or idle this long: a later submit starts a thread anew.
                        if me in self._threads:
                            self._threads.remove(me)
                        break
                    if isinstance(item, Attempt):
                        self._running[me] = item
                if item is _IDLE:
                    continue  # work was queued as this thread gave up waiting: take it
                if not isinstance(item, Attempt):
                    item()
                    continue
                try:
                    self._work(item)
                finally:
                    with self._lock:
                        self._running.pop(me, None)
                if item.abandoned:
                    break  # replaced while its handler ran past its time limit
        finally:
            connections.close_all()

    def threads(self) -> int:
        """How many worker threads are alive (replaced ones left out)."""
        with self._lock:
            return len(self._threads)

    def idle(self) -> int:
        """How many attempts submitted now would be taken at once: by free threads, or by threads
        the pool may still start (a hint: it may be low)."""
        with self._lock:
            return max(0, self._waiting - self._queue.qsize()) + self.size - len(self._threads)

    def submit(self, work: Attempt | Callable[[], None]) -> None:
        """Queue an attempt to run, or a call (what follows an outcome's commit; it must not raise);
        start a thread for it when none is free and the pool is not full."""
        with self._lock:
            self._queue.put(work)
            if self._waiting < self._queue.qsize() and len(self._threads) < self.size:
                self._start_thread()

    def replace(self, attempt: Attempt) -> None:
        """Count the thread stuck in ``attempt``'s handler out of the pool, which may then start
        another; the stuck one is left to end on its own (a daemon: it never holds the process up)."""
        with self._lock:
            stuck = [thread for thread, item in self._running.items() if item is attempt]
            self._threads = [thread for thread in self._threads if thread not in stuck]
            if self._queue.qsize() > self._waiting:
                self._start_thread()

    def stop(self, timeout: float) -> bool:
        """Ask every thread to end; True when all ended within ``timeout``. Replaced threads are
        not waited for."""
        with self._lock:
            threads = list(self._threads)
        for _ in threads:
            self._queue.put(None)
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in threads)
