"""Ending pauses: the tasks whose ``disabled_until`` has passed are enabled again."""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction

from scheduler_app import audit, schedule
from scheduler_app.models import NOT_PAUSED, ChangeAction, ChangeVia, Task

BATCH = 200
logger = logging.getLogger("scheduler_app")


def resume_ended(now: datetime, node: str) -> bool:
    """Enable up to one batch of tasks paused until ``now`` or before; True when more may be due.

    Task rows are locked with SKIP LOCKED, so each is resumed (and its change recorded) by one
    runner. Its schedule goes on from its first fire time at or after ``disabled_until``: the
    minutes of the pause are neither run nor recorded as missed; those after it follow the misfire
    grace, as any fire time a runner reaches late.
    """
    with transaction.atomic(), audit.acting(node, via=ChangeVia.RUNNER):
        tasks = list(
            Task.objects.select_for_update(skip_locked=True)
            .filter(enabled=False, disabled_until__lte=now)
            .order_by("disabled_until")[:BATCH]
        )
        for task in tasks:
            before = audit.values(task)
            until = task.disabled_until
            assert until is not None
            task.enabled = True
            for field, value in NOT_PAUSED.items():
                setattr(task, field, value)
            task.revision += 1
            try:
                # From the pause's end, not from this tick: a fire time at ``until`` or just after
                # it runs (or, past the misfire grace of a late runner, is recorded as missed).
                task.next_run_at = schedule.next_fire(task, until - schedule.ONE_MICROSECOND)
            except ValueError:
                # A schedule stored around validation: the task is enabled, and fires once fixed.
                logger.error("task %s has an invalid schedule; it will not fire until fixed", task.id)
                task.next_run_at = None
            task.save()
            audit.record(ChangeAction.UPDATE, task, before, audit.values(task))
            logger.info("task %s: its pause ended, enabled again", task.id)
    return len(tasks) >= BATCH
