"""A Django app that runs cron tasks across many nodes sharing one database."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["TaskSkipped", "__version__", "job", "scheduler"]

from scheduler_app.exceptions import TaskSkipped
from scheduler_app.jobs import job

if TYPE_CHECKING:
    from scheduler_app.services import Scheduler

    scheduler: Scheduler


def __getattr__(name: str) -> Any:
    # The scheduler imports models, which need the app registry: load it on first use.
    if name == "scheduler":
        from scheduler_app.services import scheduler

        return scheduler
    raise AttributeError(name)
