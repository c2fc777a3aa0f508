"""testproject/run.sh as a newcomer starts it: no pip on a current .venv, a taken port refused, the
admin kept up through a runner crash, and Ctrl-C or SIGTERM stopping everything.

The script runs on the checkout's .venv (recorded as current first, so nothing is installed into
it) and on a SQLite file in a temporary folder (SCHEDULER_DEMO_DB), never testproject/db.sqlite3.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import signal
import socket
import sqlite3
import subprocess
import termios
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path

import pytest

from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent
INSTALLING = "run.sh: installing"
# The suite runs once per database; the demo is SQLite only, so once is enough.
pytestmark = [
    pytest.mark.skipif(
        os.environ.get("SCHEDULER_TEST_DB", "sqlite") != "sqlite", reason="the demo runs on SQLite"
    ),
    pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the script's processes in /proc"),
    pytest.mark.skipif(
        not (ROOT / ".venv" / "bin" / "python").exists(), reason="run.sh uses the checkout's .venv"
    ),
]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state, ppid, pgrp, session, ...)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def session(leader: int) -> list[int]:
    """The live processes of the session ``leader`` started: run.sh and all it started, even those
    in process groups of their own (set -m) or orphaned."""
    members = []
    for entry in os.listdir("/proc"):
        fields = _stat(int(entry)) if entry.isdigit() else None
        if fields is not None and fields[0] != "Z" and int(fields[3]) == leader:
            members.append(int(entry))
    return sorted(members)


def admin_status(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/login/", timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def _take_the_terminal() -> None:
    """In the child, after setsid: make stdin (a pseudo-terminal) the session's controlling terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Demo:
    """One `bash testproject/run.sh` in a session of its own, its output in a file; stop() ends it and
    every process of its session."""

    def __init__(self, folder: Path, port: int, database: Path, *args: str, terminal: bool = False) -> None:
        self.port = port
        # With a terminal, as in a shell: run.sh's session has it as its controlling terminal, so
        # ctrl_c() sends SIGINT to the terminal's foreground process group, as Ctrl-C does.
        self._terminal, stdin = pty.openpty() if terminal else (None, subprocess.DEVNULL)
        self.log = folder / f"run-{len(list(folder.glob('run-*.log')))}.log"
        environment = {
            key: value
            for key, value in os.environ.items()
            # The suite's settings and databases are not the demo's.
            if key not in {"DJANGO_SETTINGS_MODULE", "PYTHONPATH", "SCHEDULER_DB", "REDIS_URL"}
            and not key.startswith("DATABASE_")
        }
        environment |= {"PORT": str(port), "SCHEDULER_DEMO_DB": str(database)}
        with open(self.log, "wb") as output:
            self.process = subprocess.Popen(
                ["bash", "testproject/run.sh", *args],
                cwd=ROOT,
                env=environment,
                stdin=stdin,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_take_the_terminal if terminal else None,
            )
        if terminal:
            os.close(stdin)

    def ctrl_c(self) -> None:
        assert self._terminal is not None
        os.write(self._terminal, b"\x03")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def runner_pids(self) -> list[int]:
        return [int(pid) for pid in re.findall(r"run\.sh: runner started \(pid (\d+)\)", self.output())]

    def wait_until_admin_answers(self, timeout: float = 40) -> None:
        def answers() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"run.sh exited with {self.process.returncode}:\n{self.output()}")
            return admin_status(self.port) == 200

        wait_for(
            answers, timeout, interval=0.1, message=f"for the admin on port {self.port}:\n{self.output()}"
        )

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"run.sh did not exit within {timeout}s:\n{self.output()}") from None

    def leftovers(self) -> list[int]:
        return session(self.process.pid)

    def stop(self, timeout: float = 40) -> int | None:
        """SIGTERM to the script (it stops what it started), then SIGKILL to whatever is left of its
        session; the script's exit status, None if it had to be killed."""
        code = None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                code = self.process.wait(timeout)
        else:
            code = self.process.returncode
        for pid in self.leftovers():
            with suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.wait(10)
        if self._terminal is not None:
            os.close(self._terminal)
            self._terminal = None
        return code


def installed_app() -> tuple[int, int]:
    """The inode and mtime of the app's installed metadata in .venv: pip replaces them when it installs."""
    (metadata,) = ROOT.glob(".venv/lib/python*/site-packages/django_scheduler_app-*.dist-info")
    stat = metadata.stat()
    return stat.st_ino, stat.st_mtime_ns


@pytest.fixture(scope="module")
def current_venv(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The suite's .venv, installed by tests/run_all.sh, recorded as current: run.sh never installs into it."""
    folder = tmp_path_factory.mktemp("mark")
    marking = Demo(folder, free_port(), folder / "unused.sqlite3", "--mark-installed")
    try:
        assert marking.wait(30) == 0, marking.output()
    finally:
        marking.stop()
    assert "recorded .venv as installed" in marking.output()


@pytest.fixture
def demo(tmp_path: Path, current_venv: None) -> Iterator[Callable[..., Demo]]:
    """Starts run.sh (on a port, a SQLite file); everything it started is stopped at teardown."""
    started: list[Demo] = []

    def start(port: int, database: Path, *, terminal: bool = False) -> Demo:
        started.append(Demo(tmp_path, port, database, terminal=terminal))
        return started[-1]

    yield start
    for one in started:
        one.stop()


def runner_rows(database: Path, *, running: bool = False) -> int:
    """How many runners wrote their row; with ``running``, how many of them have not stopped."""
    sql = "SELECT COUNT(*) FROM scheduler_app_runner" + (" WHERE stopped_at IS NULL" if running else "")
    with sqlite3.connect(database) as connection:
        return int(connection.execute(sql).fetchone()[0])


def test_a_second_start_runs_no_pip_and_sigterm_or_ctrl_c_stop_everything_it_started(demo, tmp_path):
    database, port = tmp_path / "demo.sqlite3", free_port()
    for start in ("first", "second"):
        before = installed_app()
        one = demo(port, database, terminal=start == "second")
        one.wait_until_admin_answers()
        assert INSTALLING not in one.output(), start
        assert installed_app() == before, f"pip ran at the {start} start"
        # Its row written, the runner handles signals: it will drain, not just die.
        wait_for(lambda: runner_rows(database, running=True) == 1, 20, message=one.output())
        if start == "first":
            one.process.send_signal(signal.SIGTERM)
        else:
            one.ctrl_c()
        assert one.wait(40) == 0, one.output()
        # One signal reached the runner: it drained and exited 0 (a second one exits at once, 1).
        assert "run.sh: the runner stopped (exit status 0)" in one.output(), start
        assert runner_rows(database, running=True) == 0
        assert one.leftovers() == [], one.output()


def test_a_taken_port_makes_run_sh_exit_1_with_the_port_and_the_way_out_before_starting_anything(
    demo, tmp_path
):
    database, port = tmp_path / "demo.sqlite3", free_port()
    first = demo(port, database)
    first.wait_until_admin_answers()
    wait_for(lambda: runner_rows(database) == 1, 20, message=first.output())

    taken = demo(port, database)
    assert taken.wait(20) == 1, taken.output()
    message = taken.output()
    assert f"port {port} on 127.0.0.1 is already in use" in message
    assert "choose another port: PORT=8001 bash testproject/run.sh" in message
    assert "runner started" not in message and "Operations to perform" not in message
    assert taken.leftovers() == []
    assert runner_rows(database) == 1


def test_the_admin_keeps_answering_when_the_runner_is_killed_and_a_new_runner_starts(demo, tmp_path):
    port = free_port()
    first = demo(port, tmp_path / "demo.sqlite3")
    first.wait_until_admin_answers()
    (runner,) = first.runner_pids()

    os.kill(runner, signal.SIGKILL)
    wait_for(lambda: not alive(runner), 10, message="the runner did not die")
    assert admin_status(port) == 200
    wait_for(lambda: len(first.runner_pids()) == 2, 20, message=first.output())
    assert "the runner stopped (killed by signal 9); the admin stays up" in first.output()
    assert admin_status(port) == 200
    assert alive(first.runner_pids()[1])
