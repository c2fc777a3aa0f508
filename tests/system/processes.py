"""Starting real runner processes against the test database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


class CommandProcess:
    """One management command process on the test database; what it writes to stderr is kept."""

    def __init__(self, side_effects: Path, *command: str, **env: str) -> None:
        environment = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PYTHONPATH": str(ROOT),
            "SCHEDULER_DB_NAME": connection.settings_dict["NAME"],
            "SCHEDULER_SIDE_EFFECTS": str(side_effects),
            **env,
        }
        command = (sys.executable, "-m", "django", *command)
        self.process = subprocess.Popen(command, cwd=ROOT, env=environment, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)

    def output(self) -> str:
        return "".join(self.lines)

    @property
    def pid(self) -> int:
        return self.process.pid

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def stop(self, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"{' '.join(self.process.args[3:])} did not exit within {timeout} s of SIGTERM; its stderr:\n"
                + self.output()[-4000:]
            ) from None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._reader.join(5)


class RunnerProcess(CommandProcess):
    """One `manage.py run_scheduler` process on the test database."""

    def __init__(self, side_effects: Path, node_id: str, *args: str, lease: float = 300, **env: str) -> None:
        self.node_id = node_id
        super().__init__(
            side_effects, "run_scheduler", "--node-id", node_id, *args, SCHEDULER_LEASE=str(lease), **env
        )


def side_effect_lines(folder: Path) -> list[str]:
    lines: list[str] = []
    for path in sorted(folder.glob("*.log")):
        lines.extend(line for line in path.read_text().splitlines() if line)
    return lines


def starts(folder: Path) -> Counter[str]:
    """How many times each (occurrence, attempt) started, from the hook's own lines."""
    return Counter(line for line in side_effect_lines(folder) if not line.endswith(",end"))
