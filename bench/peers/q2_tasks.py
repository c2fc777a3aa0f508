"""django-q2's no-op task: one line per execution, as bench/noop_hook.py writes it for ours."""

from bench.noop_hook import record


def noop(task_id: str, occurrence: str = "", due: str = "") -> None:
    # A schedule passes its due time as ``due`` (Schedule.intended_date_kwarg): the occurrence.
    record(task_id, occurrence or f"{task_id}@{due}")
