"""Django signals sent around each attempt; receivers get ``event`` (a TaskEvent)."""

from django.dispatch import Signal

task_started = Signal()
task_interrupted = Signal()
task_finished = Signal()
