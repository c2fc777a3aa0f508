"""The ``django_task`` handler kind: enqueue a Django task (django.tasks, or the django-tasks backport) and follow it.

Each attempt enqueues at most once per occurrence: the result id is stored on the execution
(``handler_ref``) before the attempt waits, and a later attempt of the occurrence follows that
result instead of enqueueing again, unless the result it follows failed (that failure is the
attempt's, and the retry enqueues afresh).
"""

from __future__ import annotations

import importlib
import inspect
import time
from types import ModuleType
from typing import Any

from django.apps import apps
from django.utils import timezone

from scheduler_app.conf import scheduler_settings
from scheduler_app.events import ExecutionContext, TaskEvent
from scheduler_app.handlers.base import Handler, HandlerError, Resumable
from scheduler_app.models import Execution, ExecutionEvent, Status
from scheduler_app.values import is_number, short_text

KEYS = frozenset({"kind", "task", "backend", "queue_name", "priority", "timeout"})
MAX_TIMEOUT = 7 * 86400
# The range django.tasks allows for a priority.
MIN_PRIORITY, MAX_PRIORITY = -100, 100
# The runner's own time limit comes this long after the handler's deadline, so that the handler
# reports the deadline with its own code.
LIMIT_MARGIN = 10.0
POLL_SECONDS = 0.5
OCCURRENCE_PARAMETER = "scheduler_occurrence"
MESSAGE_MAX = 500

TASK_FAILED = "scheduler:036"
TASK_TIMED_OUT = "scheduler:037"
TASK_UNAVAILABLE = "scheduler:038"


def task_classes() -> tuple[type, ...]:
    """The Task classes of ``django.tasks`` (Django 6) and of the ``django_tasks`` backport, where installed.

    Both count: on Django 6 a backend of the backport makes ``django.tasks.task`` build the backport's Task.
    """
    classes = []
    for name in ("django.tasks", "django_tasks"):
        try:
            importlib.import_module(name)
            module: ModuleType = importlib.import_module(f"{name}.base")
        except ImportError:
            continue
        classes.append(module.Task)
    return tuple(classes)


def allowed_module(module: str) -> bool:
    """A module of an installed app or of TASK_MODULES, or inside one: the only ones a config may import."""
    listed = scheduler_settings.TASK_MODULES
    roots = [config.name for config in apps.get_app_configs()]
    roots += [name for name in listed if isinstance(name, str)] if isinstance(listed, (list, tuple)) else []
    return any(module == root or module.startswith(root + ".") for root in roots)


def find_task(path: str) -> Any:
    """The Task object at ``path``; ValueError saying why when there is none there."""
    classes = task_classes()
    if not classes:
        raise ValueError("Django's tasks framework is not installed: install django-scheduler-app[tasks].")
    module, _, name = path.rpartition(".")
    parts = path.split(".")
    if not module or not all(part.isidentifier() for part in parts):
        raise ValueError("Must be the dotted path of a task, such as myapp.tasks.send_report.")
    if not allowed_module(module):
        raise ValueError(f"{short_text(path)} is not in a module of an installed app or of TASK_MODULES.")
    try:
        target = getattr(importlib.import_module(module), name, None)
    except Exception as exc:
        raise ValueError(f"{short_text(module)} cannot be imported: {type(exc).__name__}.") from None
    if not isinstance(target, classes):
        raise ValueError(f"{short_text(path)} is not a task: decorate its function with @task.")
    return target


class DjangoTaskHandler(Handler):
    """Enqueues the task with the execution's params as keyword arguments and follows its result."""

    kind = "django_task"

    def validate(self, config: dict[str, Any]) -> dict[str, list[str]]:
        errors: dict[str, list[str]] = {}
        unknown = sorted(str(key) for key in set(config) - KEYS)
        if unknown:
            errors[""] = [f"Unknown keys: {', '.join(unknown)}."]
        path = config.get("task")
        if not isinstance(path, str) or not path:
            errors["task"] = ["Must be the dotted path of a task, such as myapp.tasks.send_report."]
        else:
            try:
                find_task(path)
            except ValueError as exc:
                errors["task"] = [str(exc)]
        for key in ("backend", "queue_name"):
            value = config.get(key)
            if value is not None and not (isinstance(value, str) and value):
                errors[key] = ["Must be a non-empty string."]
        priority = config.get("priority")
        if priority is not None and not (
            isinstance(priority, int)
            and not isinstance(priority, bool)
            and MIN_PRIORITY <= priority <= MAX_PRIORITY
        ):
            errors["priority"] = [f"Must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}."]
        timeout = config.get("timeout")
        if timeout is not None and not (is_number(timeout) and 0 < timeout <= MAX_TIMEOUT):
            errors["timeout"] = [f"Must be a number of seconds above 0 and at most {MAX_TIMEOUT}."]
        return errors

    def deadline_seconds(self, config: dict[str, Any]) -> float:
        timeout = config.get("timeout")
        return float(timeout if timeout is not None else scheduler_settings.HOOK_TIMEOUT)

    def time_limit(self, config: dict[str, Any]) -> float | None:
        return self.deadline_seconds(config) + LIMIT_MARGIN

    def run(self, event: TaskEvent) -> Any:
        config = dict(event.task.handler or {})
        deadline = time.monotonic() + self.deadline_seconds(config)
        try:
            task = find_task(str(config.get("task", ""))).using(
                backend=config.get("backend"),
                queue_name=config.get("queue_name"),
                priority=config.get("priority"),
            )
        except Exception as exc:
            raise HandlerError(
                TASK_UNAVAILABLE, f"The task cannot be used on this node: {cut(exc)}"
            ) from None
        backend = task.get_backend()
        context = event.context
        stored = (
            Execution.objects.filter(sequence=context.sequence).values_list("handler_ref", flat=True).first()
        )
        if stored:
            # A resumed attempt keeps the deadline of its first start, so resumes cannot go on for ever.
            deadline -= seconds_since_first_start(context)
            if not backend.supports_get_result:
                return {"enqueued": stored, "followed": False}
            try:
                result = task.get_result(stored)
            except Exception as exc:
                raise HandlerError(
                    TASK_UNAVAILABLE, f"The enqueued task {stored} cannot be read: {cut(exc)}"
                ) from None
        else:
            kwargs = dict(context.params)
            if OCCURRENCE_PARAMETER in inspect.signature(task.func).parameters:
                kwargs[OCCURRENCE_PARAMETER] = {
                    "occurrence_id": context.occurrence_id,
                    "sequence": context.sequence,
                    "attempt": context.attempt,
                }
            try:
                result = task.enqueue(**kwargs)
            except Exception as exc:
                raise HandlerError(TASK_UNAVAILABLE, f"The task could not be enqueued: {cut(exc)}") from None
            # Fenced: a runner that lost the row writes nothing, and its finish writes nothing either.
            Execution.objects.filter(
                sequence=context.sequence, execution_token=context.execution_token, status=Status.RUNNING
            ).update(handler_ref=str(result.id))
            if not result.is_finished and not backend.supports_get_result:
                return {"enqueued": str(result.id), "followed": False}
        while not result.is_finished:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise HandlerError(
                    TASK_TIMED_OUT,
                    f"The task {result.id} did not finish within {self.deadline_seconds(config):g}s "
                    f"(status {result.status}); the next attempt follows it.",
                )
            if event.cancelled.wait(min(POLL_SECONDS, remaining)):
                raise Resumable
            try:
                result.refresh()
            except Exception as exc:
                raise HandlerError(
                    TASK_UNAVAILABLE, f"The task {result.id} cannot be read: {cut(exc)}"
                ) from None
        if result.status == "SUCCESSFUL":
            return result.return_value
        # The failure is this attempt's: the scheduler's retry enqueues afresh.
        Execution.objects.filter(
            sequence=context.sequence, execution_token=context.execution_token, status=Status.RUNNING
        ).update(handler_ref="")
        raise HandlerError(TASK_FAILED, f"The task {result.id} failed: {describe_errors(result)}")


def seconds_since_first_start(context: ExecutionContext) -> float:
    """How long ago this attempt first started (it started again at each resume after a crash or a shutdown)."""
    first = (
        ExecutionEvent.objects.filter(
            execution_id=context.sequence, attempt=context.attempt, to_status=Status.RUNNING
        )
        .order_by("at")
        .values_list("at", flat=True)
        .first()
    )
    return max(0.0, (timezone.now() - first).total_seconds()) if first is not None else 0.0


def describe_errors(result: Any) -> str:
    """The last error's exception class and the traceback's last line, cut."""
    if not result.errors:
        return "no error recorded"
    error = result.errors[-1]
    lines = [line for line in str(error.traceback).strip().splitlines() if line.strip()]
    last = lines[-1].strip() if lines else error.exception_class_path
    return clip(
        last
        if last.startswith(error.exception_class_path.rpartition(".")[2])
        else f"{error.exception_class_path}: {last}"
    )


def cut(exc: BaseException) -> str:
    return clip(f"{type(exc).__name__}: {exc}")


def clip(text: str) -> str:
    return text if len(text) <= MESSAGE_MAX else text[: MESSAGE_MAX - 3] + "..."
