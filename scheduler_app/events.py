"""What handlers and hooks receive: the execution context and the event object."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scheduler_app.models import ExecutionLog, Task


@dataclass(frozen=True)
class ExecutionContext:
    """Identity of one attempt; ``execution_token`` is secret and only hooks see it."""

    occurrence_id: str
    sequence: int
    attempt: int
    execution_token: str
    task_id: str
    params: dict[str, Any]
    trigger_type: str
    trigger_source: str


@dataclass
class TaskEvent:
    """Passed to every hook and signal receiver."""

    task: Task
    context: ExecutionContext
    cancelled: threading.Event = field(default_factory=threading.Event)
    log: ExecutionLog | None = None
