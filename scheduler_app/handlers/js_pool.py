"""Child processes that run JavaScript, one request at a time each; late or cancelled ones are killed."""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from contextlib import suppress
from pathlib import Path
from typing import Any, TypeGuard

from scheduler_app.handlers.base import HandlerError
from scheduler_app.handlers.js_child import HEADER, JS_FAILED

CHILD = Path(__file__).with_name("js_child.py")
# How often a waiting attempt looks at its cancellation event.
POLL_SECONDS = 0.05
# The child stops V8 itself at the deadline; this is how long to wait for it to say so.
GRACE_SECONDS = 0.5
MAX_ANSWER_BYTES = 64 * 1024 * 1024
# Children kept waiting for the next request: a burst of js attempts on many workers starts a
# child for each (about 67 MiB each), and all but these few end with it.
MAX_IDLE = 4
# What the child needs to start Python and find py_mini_racer; secrets in the environment stay out.
ENVIRONMENT = ("PATH", "PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH", "LANG", "LC_ALL", "LC_CTYPE")


class Child:
    """One ``js_child.py`` process and its two pipes."""

    def __init__(self, memory_limit_mb: int) -> None:
        # -P: this folder holds http.py, which must not shadow the standard library in the child.
        self.process = subprocess.Popen(
            [sys.executable, "-P", str(CHILD), str(memory_limit_mb)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
            env={key: os.environ[key] for key in ENVIRONMENT if key in os.environ},
            start_new_session=True,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self._requests = self.process.stdin.fileno()
        self._answers = self.process.stdout.fileno()
        self._poll = select.poll()
        self._poll.register(self._answers, select.POLLIN)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def ask(self, request: dict[str, Any], deadline: float, cancelled: threading.Event) -> dict[str, Any]:
        """Send one request and wait for its answer until the deadline (plus grace) or cancellation."""
        body = json.dumps(request).encode()
        try:
            data = memoryview(HEADER.pack(len(body)) + body)
            while data:
                data = data[os.write(self._requests, data) :]
        except OSError:
            raise HandlerError(JS_FAILED, self._ended()) from None
        (size,) = HEADER.unpack(self._read(HEADER.size, deadline, cancelled))
        if size > MAX_ANSWER_BYTES:
            raise HandlerError(JS_FAILED, "The JavaScript process sent an oversized answer.")
        try:
            answer = json.loads(self._read(size, deadline, cancelled))
        except ValueError:
            answer = None
        if not _well_formed(answer):
            raise HandlerError(JS_FAILED, "The JavaScript process sent a malformed answer.")
        return answer

    def _read(self, size: int, deadline: float, cancelled: threading.Event) -> bytes:
        data = bytearray()
        while len(data) < size:
            if cancelled.is_set():
                raise HandlerError(JS_FAILED, "cancelled")
            wait = deadline + GRACE_SECONDS - time.monotonic()
            if wait <= 0:
                raise HandlerError(JS_FAILED, "timed out")
            if self._poll.poll(min(wait, POLL_SECONDS) * 1000):
                chunk = os.read(self._answers, size - len(data))
                if not chunk:
                    raise HandlerError(JS_FAILED, self._ended())
                data += chunk
        return bytes(data)

    def _ended(self) -> str:
        try:
            code = self.process.wait(1)
        except subprocess.TimeoutExpired:
            return "The JavaScript process stopped answering."
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        return f"The JavaScript process ended unexpectedly ({how}); it may have run out of memory."

    def kill(self) -> None:
        if self.alive():
            self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()


class Pool:
    """Idle children ready for the next request (at most MAX_IDLE); a child that failed is killed
    and replaced."""

    def __init__(self, memory_limit_mb: int) -> None:
        self.memory_limit_mb = memory_limit_mb
        self._lock = threading.Lock()
        self._idle: list[Child] = []
        self._children: set[Child] = set()
        self._closed = False

    def ask(
        self, request: dict[str, Any], deadline: float, cancelled: threading.Event | None = None
    ) -> dict[str, Any]:
        """Run one request in an idle child; HandlerError when the child failed to answer in time."""
        cancelled = cancelled or threading.Event()
        child = self._acquire()
        try:
            answer = child.ask(request, deadline, cancelled)
        except BaseException:
            self._discard(child, replace=not cancelled.is_set())
            raise
        with self._lock:
            keep = not self._closed and len(self._idle) < MAX_IDLE
            if keep:
                self._idle.append(child)
            else:
                self._children.discard(child)
        if not keep:
            child.kill()
        return answer

    def children(self) -> list[int]:
        """The process ids of every child, idle or busy."""
        with self._lock:
            return [child.pid for child in self._children]

    def close(self) -> None:
        """Kill every child; requests in flight end with an error."""
        with self._lock:
            self._closed = True
            idle, busy = self._idle, self._children.difference(self._idle)
            self._idle, self._children = [], set()
        for child in idle:
            child.kill()
        for child in busy:
            # Only the signal: the thread reading its pipe sees it close and cleans up.
            child.process.kill()

    def _acquire(self) -> Child:
        with self._lock:
            while self._idle:
                child = self._idle.pop()
                if child.alive():
                    return child
                self._children.discard(child)
                child.kill()
            return self._spawn()

    def _discard(self, child: Child, *, replace: bool) -> None:
        child.kill()
        with self._lock:
            self._children.discard(child)
            if replace and not self._closed:
                with suppress(HandlerError):
                    self._idle.append(self._spawn())

    def _spawn(self) -> Child:
        try:
            child = Child(self.memory_limit_mb)
        except OSError:
            # The OS error names local paths: keep it out of the journal.
            raise HandlerError(JS_FAILED, "The JavaScript process could not start.") from None
        self._children.add(child)
        return child


def _well_formed(answer: Any) -> TypeGuard[dict[str, Any]]:
    """Whether ``answer`` is ``{"result": str}`` or ``{"code": str, "error": str}``, as the child sends."""
    if not isinstance(answer, dict):
        return False
    if "error" in answer:
        return isinstance(answer.get("code"), str) and isinstance(answer["error"], str)
    return isinstance(answer.get("result"), str)


_pool: Pool | None = None
_pool_lock = threading.Lock()


def shared_pool(memory_limit_mb: int) -> Pool:
    """This process's pool, replaced when the memory limit changes."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool.memory_limit_mb != memory_limit_mb:
            if _pool is not None:
                _pool.close()
            _pool = Pool(memory_limit_mb)
        return _pool


def close_shared_pool() -> None:
    """Kill this process's JavaScript children; the next request starts new ones."""
    global _pool
    with _pool_lock:
        if _pool is not None:
            _pool.close()
        _pool = None


def _forget_after_fork() -> None:
    # The children belong to the parent: a forked process starts its own.
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


atexit.register(close_shared_pool)
os.register_at_fork(after_in_child=_forget_after_fork)
