"""Django tasks (the django-tasks backport on Django 5.2) that django_task handlers of the tests name."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

try:
    from django.tasks import task
    from django.tasks.backends.dummy import DummyBackend

    FRAMEWORK = "django.tasks"
except ImportError:
    import django_tasks.signals  # noqa: F401  resets the backends when a test overrides TASKS
    from django_tasks import task
    from django_tasks.backends.dummy import DummyBackend

    FRAMEWORK = "django_tasks"

CALLS: list[dict[str, Any]] = []


class StoredBackend(DummyBackend):
    """A dummy backend whose results every thread shares and can read back: a queue no worker serves."""

    supports_get_result = True
    shared: list[Any] = []
    # Each read of a result, by id: how often a handler looked.
    reads: list[str] = []

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.results = StoredBackend.shared

    def get_result(self, result_id: str) -> Any:
        StoredBackend.reads.append(result_id)
        return super().get_result(result_id)


@task()
def add(a: int, b: int) -> dict[str, int]:
    CALLS.append({"a": a, "b": b})
    return {"sum": a + b}


@task()
def broken(**params: Any) -> None:
    CALLS.append(params)
    raise ValueError("the report is broken")


@task()
def report(scheduler_occurrence: dict[str, Any], **params: Any) -> dict[str, Any]:
    CALLS.append(params)
    return {"occurrence": scheduler_occurrence, "params": params}


@task()
def record(scheduler_occurrence: dict[str, Any], **params: Any) -> dict[str, Any]:
    """Appends a line per run to SCHEDULER_SIDE_EFFECTS (the process tests count them) and says which process ran it."""
    folder = Path(os.environ["SCHEDULER_SIDE_EFFECTS"])
    with open(folder / f"task-{os.getpid()}.log", "a") as lines:
        lines.write(f"task,{scheduler_occurrence['occurrence_id']},{scheduler_occurrence['attempt']}\n")
    return {"params": params, "pid": os.getpid()}


not_a_task = add.func
