"""The runner's worker threads: each takes attempts, and what follows their outcomes' commits, from
one queue and runs them; one stuck in a handler past its time limit is replaced (runner/limits.py)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from django.db import connections

from scheduler_app.runner.attempt import Attempt


class WorkerPool:
    """Threads that run attempts; each closes its database connections when it ends."""

    def __init__(self, size: int, work: Callable[[Attempt], None]) -> None:
        self._queue: queue.Queue[Attempt | Callable[[], None] | None] = queue.Queue()
        self._work = work
        self._waiting = 0  # threads blocked on the queue
        self._lock = threading.Lock()  # guards the count, the live threads and what they run
        self._threads: list[threading.Thread] = []
        self._running: dict[threading.Thread, Attempt] = {}
        self._started = 0
        for _ in range(size):
            self._start_thread()

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
                item = self._queue.get()
                with self._lock:
                    self._waiting -= 1
                    if isinstance(item, Attempt):
                        self._running[me] = item
                if item is None:
                    break
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

    def idle(self) -> int:
        """How many threads would take an attempt submitted now at once (a hint: it may be low)."""
        with self._lock:
            return max(0, self._waiting - self._queue.qsize())

    def submit(self, work: Attempt | Callable[[], None]) -> None:
        """Queue an attempt to run, or a call (what follows an outcome's commit; it must not raise)."""
        self._queue.put(work)

    def replace(self, attempt: Attempt) -> None:
        """Start a thread in place of the one stuck in ``attempt``'s handler, which is left to end
        on its own (it is a daemon: it never holds the process up)."""
        with self._lock:
            stuck = [thread for thread, item in self._running.items() if item is attempt]
            self._threads = [thread for thread in self._threads if thread not in stuck]
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
