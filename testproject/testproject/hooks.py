"""Sample hooks: what a host project writes to run its handlerless tasks."""

import logging

from scheduler_app.events import TaskEvent

logger = logging.getLogger("testproject")


def on_task_execute(event: TaskEvent) -> dict:
    params = event.context.params
    if params.get("fail_on_first_attempt") and event.context.attempt == 1:
        raise RuntimeError("first attempt fails on purpose")
    logger.info("running %s (attempt %s)", event.task.id, event.context.attempt)
    return {"task": event.task.id, "params": params}


def on_task_finish(event: TaskEvent) -> None:
    if event.log is not None:
        logger.info("%s finished: %s", event.task.id, event.log.status)
