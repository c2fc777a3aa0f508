"""Settings of the benchmark runners: the test settings with the no-op hook of the workloads."""

import os

from tests.settings import *  # noqa: F403

SCHEDULER_APP = {**SCHEDULER_APP, "HOOKS": {"on_task_execute": "bench.noop_hook.on_task_execute"}}  # noqa: F405

# BENCH_PREPARE_THRESHOLD=5 lets psycopg prepare statements (Django turns that off by default).
if os.environ.get("BENCH_PREPARE_THRESHOLD") and DATABASES["default"]["ENGINE"].endswith("postgresql"):  # noqa: F405
    DATABASES["default"]["OPTIONS"] = {  # noqa: F405
        **DATABASES["default"].get("OPTIONS", {}),  # noqa: F405
        "prepare_threshold": int(os.environ["BENCH_PREPARE_THRESHOLD"]),
    }

# BENCH_PREPARED_STATEMENTS=0 turns off what the scheduler prepares by default (for a comparison).
if os.environ.get("BENCH_PREPARED_STATEMENTS") == "0":
    SCHEDULER_APP = {**SCHEDULER_APP, "PREPARED_STATEMENTS": False}
