"""A module of tasks outside every installed app: django_task handlers may name it only through TASK_MODULES."""

from __future__ import annotations

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task()
def double(n: int) -> int:
    return 2 * n
