"""Sample hooks: what a host project writes to run its handlerless tasks."""

import logging

from scheduler_app.events import TaskEvent

logger = logging.getLogger("testproject")


def on_task_execute(event: TaskEvent) -> dict:
    task, context = event.task, event.context
    params = context.params
    logger.info("running %s (attempt %s of %s)", task.id, context.attempt, task.retry_max_attempts)
    if params.get("fail_on_first_attempt") and context.attempt == 1:
        raise RuntimeError("first attempt fails on purpose")
    if params.get("seconds"):
        # Returns early when the runner cancels the attempt (shutdown, stop request, lost lease).
        event.cancelled.wait(params["seconds"])
    return {"task": task.id, "params": params}


def on_task_finish(event: TaskEvent) -> None:
    log, task = event.log, event.task
    if log is None:
        return
    if log.status == "failed" and log.attempt < task.retry_max_attempts:
        logger.info(
            "%s attempt %s failed (%s); attempt %s of %s in %g s",
            task.id,
            log.attempt,
            (log.error or {}).get("message", ""),
            log.attempt + 1,
            task.retry_max_attempts,
            task.backoff_before(log.attempt + 1),
        )
    else:
        logger.info("%s attempt %s finished: %s", task.id, log.attempt, log.status)


def on_task_interrupted(event: TaskEvent) -> None:
    log = event.log
    if log is not None:
        logger.info(
            "%s attempt %s interrupted: %s", event.task.id, log.attempt, (log.error or {}).get("reason", "")
        )
