"""Settings of the benchmark runners: the test settings with the no-op hook of the workloads."""

from tests.settings import *  # noqa: F403

SCHEDULER_APP = {**SCHEDULER_APP, "HOOKS": {"on_task_execute": "bench.noop_hook.on_task_execute"}}  # noqa: F405
