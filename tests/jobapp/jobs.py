"""Found by autodiscovery: scheduler_app imports every installed app's jobs module at start-up."""

from __future__ import annotations

from typing import Any

from scheduler_app import TaskSkipped, job
from scheduler_app.events import TaskEvent


@job("echo")
def echo(event: TaskEvent) -> dict[str, Any]:
    context = event.context
    return {
        "task": event.task.id,
        "params": context.params,
        "occurrence_id": context.occurrence_id,
        "attempt": context.attempt,
        "trigger": context.trigger_type,
        "has_token": bool(context.execution_token),
        "cancelled": event.cancelled.is_set(),
    }


@job("explode")
def explode(event: TaskEvent) -> None:
    raise RuntimeError("exploded on purpose")


@job("skip")
def skip(event: TaskEvent) -> None:
    raise TaskSkipped("nothing to do today")


@job("not-json")
def not_json(event: TaskEvent) -> object:
    return object()
