"""The workloads' no-op handler: its only side effect is one line ``<task id>,<time>`` per execution.

Lines go to ``<BENCH_SIDE_EFFECTS>/<pid>.log``; executions and duplicates are
counted from these lines, not from the scheduler's tables. Each line also
carries the occurrence id, so a duplicate run of one occurrence is told apart
from two occurrences of one task.
"""

from __future__ import annotations

import os
import threading
import time
from typing import IO, Any

_lock = threading.Lock()
_file: IO[str] | None = None


def _open() -> IO[str]:
    global _file
    if _file is None:
        folder = os.environ["BENCH_SIDE_EFFECTS"]
        _file = open(os.path.join(folder, f"{os.getpid()}.log"), "a", buffering=1)  # noqa: SIM115
    return _file


def on_task_execute(event: Any) -> None:
    line = f"{event.context.task_id},{time.time():.6f},{event.context.occurrence_id}\n"
    with _lock:
        _open().write(line)


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
