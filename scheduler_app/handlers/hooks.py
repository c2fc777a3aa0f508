"""The host project's hooks: on_task_execute runs tasks that have no handler."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.utils.module_loading import import_string

from scheduler_app import signals
from scheduler_app.conf import scheduler_settings
from scheduler_app.events import TaskEvent
from scheduler_app.handlers.base import Handler, MissingHandler

logger = logging.getLogger("scheduler_app")

HOOK_NAMES = ("on_task_start", "on_task_execute", "on_task_interrupted", "on_task_finish")
SIGNALS = {
    "on_task_start": signals.task_started,
    "on_task_interrupted": signals.task_interrupted,
    "on_task_finish": signals.task_finished,
}


def get_hook(name: str) -> Callable[[TaskEvent], Any] | None:
    path = scheduler_settings.HOOKS.get(name)
    if not path:
        return None
    hook: Callable[[TaskEvent], Any] = import_string(path) if isinstance(path, str) else path
    return hook


def hook_follows(name: str, sender: type) -> bool:
    """Whether calling the hook ``name`` for a task of model ``sender`` would run anything: the
    hook, or a receiver of its signal."""
    signal = SIGNALS.get(name)
    return bool(scheduler_settings.HOOKS.get(name)) or (signal is not None and signal.has_listeners(sender))


def call_hook(name: str, event: TaskEvent) -> None:
    """Call a hook and send its signal; errors are the caller's to handle."""
    hook = get_hook(name)
    if hook is not None:
        hook(event)
    signal = SIGNALS.get(name)
    if signal is not None:
        signal.send(sender=type(event.task), event=event)


def notify(name: str, event: TaskEvent) -> None:
    """Call an after-the-fact hook; its failure is logged and changes nothing."""
    try:
        call_hook(name, event)
    except Exception:
        logger.exception("hook %s failed for %s", name, event.context.occurrence_id)


class HookHandler(Handler):
    """Runs a task without a handler through the on_task_execute hook."""

    kind = ""

    def time_limit(self, config: dict[str, Any]) -> float | None:
        return float(scheduler_settings.HOOK_TIMEOUT)

    def run(self, event: TaskEvent) -> Any:
        hook = get_hook("on_task_execute")
        if hook is None:
            raise MissingHandler("The task has no handler and no on_task_execute hook is set.")
        return hook(event)
