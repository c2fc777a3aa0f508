"""Django signals sent around each attempt; receivers get ``event`` (a TaskEvent)."""

from django.dispatch import Signal

task_started = Signal()
task_interrupted = Signal()
task_finished = Signal()

# Sent with ``execution`` and ``now`` (sender: the Execution class) once an execution is recorded
# unknown, or failed with no attempt left (scheduler_app/alerts.py).
execution_unknown = Signal()
execution_failed = Signal()
