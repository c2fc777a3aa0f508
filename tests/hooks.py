"""Hooks the tests configure: side effects go to a file per process, or to memory."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from typing import Any

from scheduler_app.events import TaskEvent
from scheduler_app.exceptions import TaskSkipped

CALLS: list[TaskEvent] = []
_lock = threading.Lock()


def start_line(task_id: str, occurrence_id: Any, attempt: int) -> str:
    """How one start of an attempt is written down: ``<task>,<occurrence>,<attempt>``."""
    return f"{task_id},{occurrence_id},{attempt}"


def started() -> Counter[str]:
    """How many times each attempt started in this process, counted like the side-effect files."""
    with _lock:
        return Counter(
            start_line(e.context.task_id, e.context.occurrence_id, e.context.attempt) for e in CALLS
        )


def _append_line(event: TaskEvent, suffix: str = "") -> None:
    folder = os.environ.get("SCHEDULER_SIDE_EFFECTS")
    if not folder:
        return
    path = os.path.join(folder, f"{os.getpid()}.log")
    context = event.context
    with _lock, open(path, "a") as handle:
        handle.write(start_line(context.task_id, context.occurrence_id, context.attempt) + suffix + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def on_task_execute(event: TaskEvent) -> Any:
    """Behaviour from params: record, then maybe fail, skip, block or return a value."""
    params = event.context.params
    with _lock:
        CALLS.append(event)
    _append_line(event)
    if params.get("block"):
        # Blocks until cancelled, or for block seconds when the task ignores cancellation.
        if params.get("ignore_cancel"):
            time.sleep(float(params["block"]))
        else:
            event.cancelled.wait(float(params["block"]))
        _append_line(event, ",end")
    if params.get("update_task"):
        from scheduler_app import scheduler

        scheduler.update_task(event.context.task_id, **params["update_task"])
    if params.get("fail"):
        raise RuntimeError(params.get("fail_message", "boom"))
    if params.get("skip"):
        raise TaskSkipped("skipped on purpose")
    if params.get("resumable"):
        from scheduler_app.handlers.base import Resumable

        raise Resumable
    return params.get("result", {"ok": True, "attempt": event.context.attempt})
