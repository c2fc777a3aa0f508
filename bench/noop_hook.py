"""The workloads' no-op handler: its only side effect is one line ``<task id>,<time>`` per execution.

Lines go to ``<BENCH_SIDE_EFFECTS>/<pid>.log``; executions and duplicates are
counted from these lines, not from the scheduler's tables. Each line also
carries the occurrence id, so a duplicate run of one occurrence is told apart
from two occurrences of one task. ``record`` writes the same line for the
peers of bench/peers/run.py, so that one reader counts every system alike.
"""

from __future__ import annotations

import os
import threading
import time
from typing import IO, Any

_lock = threading.Lock()
_file: IO[str] | None = None
_pid = 0


def _open() -> IO[str]:
    global _file, _pid
    if _file is None or _pid != os.getpid():  # a forked worker (django-q2) writes a file of its own
        folder = os.environ["BENCH_SIDE_EFFECTS"]
        _file = open(os.path.join(folder, f"{os.getpid()}.log"), "a", buffering=1)  # noqa: SIM115
        _pid = os.getpid()
    return _file


def record(task_id: str, occurrence_id: str) -> None:
    """Append the line of one execution: ``<task id>,<unix time>,<occurrence id>``."""
    line = f"{task_id},{time.time():.6f},{occurrence_id}\n"
    with _lock:
        _open().write(line)


def on_task_execute(event: Any) -> None:
    record(event.context.task_id, str(event.context.occurrence_id))


def read_side_effects(folder: str) -> list[tuple[str, float, str]]:
    """Every complete line written under ``folder``: (task id, unix time, occurrence id)."""
    rows = []
    for name in os.listdir(folder):
        if not name.endswith(".log"):
            continue
        with open(os.path.join(folder, name)) as handle:
            for line in handle:
                parts = line.rstrip("\n").split(",")
                if len(parts) == 3 and line.endswith("\n"):
                    rows.append((parts[0], float(parts[1]), parts[2]))
    return rows
