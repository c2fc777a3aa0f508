"""A task declared beside its function, for the runner processes of tests/system/test_declared_tasks.py."""

from __future__ import annotations

from scheduler_app import job
from scheduler_app.events import TaskEvent


@job("declared-report", cron="0 3 * * *", timezone="Europe/Berlin", retry={"max_attempts": 2}, timeout=60)
def declared_report(event: TaskEvent) -> str:
    return "reported"
