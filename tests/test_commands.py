"""The management commands: run_scheduler's options and the health command."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from datetime import timedelta
from io import StringIO
from pathlib import Path
from unittest import mock

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import OperationalError, connection
from django.urls import reverse

from scheduler_app import __version__, db, scheduler
from scheduler_app.models import Execution, Task
from scheduler_app.models import Runner as RunnerRecord
from scheduler_app.runner.loop import SchedulerLoop
from tests.factories import definition
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.django_db(transaction=True)


def test_run_scheduler_once_runs_what_is_due_and_exits():
    scheduler.register(definition(cron="0 0 1 1 *"))
    execution = scheduler.trigger("report", params={"result": "once"})
    call_command("run_scheduler", "--once", "--workers", "2", "--node-id", "cli", "--lease", "60")
    execution.refresh_from_db()
    assert (execution.status, execution.result, execution.owner) == ("success", "once", "cli")
    record = RunnerRecord.objects.get(node_id="cli")
    assert record.stopped_at is not None and record.pid > 0


def test_run_scheduler_says_who_it_is_at_start_at_the_default_verbosity(caplog):
    output = StringIO()
    with caplog.at_level(logging.WARNING, logger="scheduler_app"):
        call_command("run_scheduler", "--once", "--workers", "3", "--node-id", "cli", stdout=output)
    first = output.getvalue().splitlines()[0]
    assert first.startswith(f"scheduler_app {__version__} runner cli started: ")
    if connection.vendor == "postgresql":
        assert first.endswith(", 3 workers, PostgreSQL LISTEN/NOTIFY wake-ups")
    else:
        assert first.endswith(", 3 workers, no wake-ups (work is found by ticks every 1s)")
    # --once ends without a signal: nothing tells the operator to signal again.
    assert "signal again" not in caplog.text
    quiet = StringIO()
    call_command("run_scheduler", "--once", "--verbosity", "0", stdout=quiet)
    assert quiet.getvalue() == ""
    # Where the runner's INFO log is shown, the line is logged once and not printed again.
    logged = StringIO()
    with caplog.at_level(logging.INFO, logger="scheduler_app"):
        call_command("run_scheduler", "--once", "--node-id", "logged", stdout=logged)
    assert logged.getvalue() == ""
    assert [
        r for r in caplog.records if r.getMessage().startswith(f"scheduler_app {__version__} runner logged")
    ]


def test_run_scheduler_once_fails_with_the_cause_when_its_tick_cannot_reach_the_database():
    real_probe, probes = db.probe, iter(range(1))

    def lost(*args, **kwargs):
        if next(probes, None) is not None:
            return real_probe(*args, **kwargs)  # the start's probe
        raise OperationalError("server closed the connection unexpectedly")

    scheduler.register(definition(cron="0 0 1 1 *"))
    with mock.patch.object(db, "probe", lost), pytest.raises(CommandError) as failed:
        call_command("run_scheduler", "--once", "--verbosity", "0")
    assert str(failed.value).startswith("the connection to ")
    assert str(failed.value).endswith(" was lost")


# The signal comes while the main thread holds the lock of the Event the loop waits on, as when
# Event.wait() re-acquires it on waking (threading.Event keeps it in _cond, a CPython detail).
# raise_signal() runs the Python handler before it returns, so the moment is exact.
SIGNAL_WHILE_WAKE_IS_HELD = """
import signal
import django

django.setup()
from django.core.management import call_command
from scheduler_app.runner.loop import SchedulerLoop


def run(self, *, once=False, on_start=None):
    with self._wake._cond:
        signal.raise_signal(signal.SIGTERM)
    print("shut down" if self._stopping.wait(10) else "not shut down", flush=True)


SchedulerLoop.run = run
call_command("run_scheduler", "--node-id", "signalled")
print("returned", flush=True)
"""


def test_a_signal_while_the_loop_holds_its_wake_lock_shuts_it_down():
    """The handler takes no lock: shutdown() runs in a thread of its own (it used to wait forever)."""
    done = subprocess.run(
        [sys.executable, "-c", SIGNAL_WHILE_WAKE_IS_HELD],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "tests.settings"},
    )
    assert (done.returncode, done.stdout.split()) == (0, ["shut", "down", "returned"]), done.stderr


def test_run_scheduler_version_is_the_apps(capsys):
    with pytest.raises(SystemExit):
        call_command("run_scheduler", "--version")
    assert capsys.readouterr().out.strip() == f"scheduler_app {__version__}"


@pytest.mark.parametrize("argument", ["--workers=0", "--tick-interval=-1", "--lease=0", "--workers=two"])
def test_run_scheduler_refuses_bad_options(argument):
    with pytest.raises(CommandError):
        call_command("run_scheduler", "--once", argument)


def runner_record(node_id: str, seen, silent_after, stopped=None) -> RunnerRecord:
    return RunnerRecord.objects.create(
        node_id=node_id,
        host="h",
        pid=1,
        started_at=seen,
        last_seen_at=seen,
        silent_after=silent_after,
        stopped_at=stopped,
        version="x",
    )


def status(*args: str) -> tuple[int, str]:
    """scheduler_status's exit code and output."""
    out = StringIO()
    try:
        call_command("scheduler_status", *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue()
    return 0, out.getvalue()


def test_scheduler_status_tells_live_from_stopped_and_silent_runners():
    assert status()[0] == 2
    now = db.probe().now
    runner_record("a", now, now + timedelta(seconds=60))
    runner_record("b", now - timedelta(minutes=5), now - timedelta(minutes=4))
    runner_record("c", now, now + timedelta(seconds=60), stopped=now)
    code, output = status()
    assert "a\talive" in output and "b\tsilent" in output and "c\tstopped" in output
    assert code == 5 and "ALERT silent_runners: runners gone silent without stopping: b" in output
    assert status("--node-id", "a")[0] == 0
    assert status("--node-id", "b")[0] == 2
    assert status("--node-id", "c")[0] == 2


def test_a_runner_is_silent_two_heartbeats_after_its_last_whatever_the_settings_lease(clock):
    """Its own --lease sets its heartbeat (a third of it, at most 30 s): scheduler_status and the admin
    read the allowance the runner wrote, not LEASE_SECONDS."""
    short = SchedulerLoop(node_id="short", workers=0, lease_seconds=15, tick_interval=0.5, clock=clock)
    default = SchedulerLoop(node_id="default", workers=0, clock=clock)
    assert (short.heartbeat_seconds, default.heartbeat_seconds) == (5.0, 30.0)
    short.start()
    default.start()
    rows = {r.node_id: r for r in RunnerRecord.objects.all()}
    assert rows["short"].silent_after - rows["short"].last_seen_at == timedelta(seconds=2 * 5 + 2 * 0.5 + 1)
    assert rows["default"].silent_after - rows["default"].last_seen_at == timedelta(
        seconds=2 * 30 + 2 * 1 + 1
    )
    states = dict(
        RunnerRecord.objects.with_state(clock.now() + timedelta(seconds=13)).values_list("node_id", "state")
    )
    assert states == {"short": "silent", "default": "alive"}


def test_scheduler_status_and_the_runner_admin_share_one_alive_rule(admin_client):
    now = db.probe().now
    runner_record("edge", now - timedelta(seconds=30), now)
    runner_record("late", now - timedelta(seconds=30), now - timedelta(microseconds=1))
    runner_record("gone", now, now + timedelta(seconds=60), stopped=now)
    page = admin_client.get(reverse("admin:scheduler_app_runner_changelist"))
    shown = {runner.node_id: runner.state for runner in page.context["cl"].result_list}
    listed = dict(line.split("\t")[:2] for line in status()[1].splitlines() if "\t" in line)
    assert shown["gone"] == listed["gone"] == "stopped"
    assert shown["late"] == listed["late"] == "silent"
    assert listed["edge"] in ("alive", "silent")  # the database clock moved on between the two reads


def test_each_condition_has_its_exit_code_and_the_lowest_wins(clock):
    now = db.probe().now
    scheduler.register(definition("report", cron="0 0 1 1 *", max_concurrency=5))
    runner_record("a", now, now + timedelta(minutes=5))
    assert status() == (0, "a\talive\tlast seen " + f"{now:%Y-%m-%dT%H:%M:%SZ}\n")
    scheduler.register(definition("broken", cron="0 0 1 1 *"))
    Task.objects.filter(id="broken").update(timezone="Mars/Olympus", next_run_at=None)
    code, output = status()
    assert code == 7 and "1 enabled tasks will not fire" in output and ": broken" in output
    failure = scheduler.trigger("report", idempotency_key="f")
    Execution.objects.filter(sequence=failure.sequence).update(status="failed", finished_at=now)
    assert status()[0] == 6  # its log row was never written
    unknown = scheduler.trigger("report", idempotency_key="u")
    Execution.objects.filter(sequence=unknown.sequence).update(
        status="unknown", updated_at=now - timedelta(minutes=3)
    )
    code, output = status()
    assert code == 4 and "1 executions in state unknown" in output and "180 s ago" in output
    late = scheduler.trigger("report", idempotency_key="l")
    Execution.objects.filter(sequence=late.sequence).update(due_at=now - timedelta(minutes=2))
    assert status()[0] == 3
    RunnerRecord.objects.update(silent_after=now - timedelta(seconds=1))
    code, output = status()
    assert code == 2
    assert [line.split(":")[0] for line in output.splitlines() if line.startswith("ALERT")] == [
        "ALERT no_live_runner",
        "ALERT late",
        "ALERT unknown",
        "ALERT silent_runners",
        "ALERT log_failures",
        "ALERT unschedulable",
    ]


def test_only_tasks_whose_schedule_cannot_be_evaluated_are_unschedulable(clock):
    """Enabled tasks without a next run are most often done (a window ended, a one-shot fired, no
    fire time left before ends_at): only a stored schedule a runner could not evaluate alerts."""
    import json

    now = db.probe().now
    runner_record("a", now, now + timedelta(minutes=5))
    scheduler.register(definition("ended", cron="* * * * *", ends_at=now + timedelta(minutes=5)))
    scheduler.register(definition("none-left", cron="0 0 1 1 *", ends_at=now + timedelta(minutes=5)))
    scheduler.register(definition("bad-zone", cron="* * * * *"))
    scheduler.register(definition("bad-cron", cron="* * * * *"))
    scheduler.register(definition("paused", cron="* * * * *"))
    Task.objects.filter(id="ended").update(ends_at=now - timedelta(minutes=1))
    Task.objects.filter(id="bad-zone").update(timezone="Mars/Olympus")
    Task.objects.filter(id="bad-cron").update(cron="61 * * * *")
    Task.objects.filter(id="paused").update(cron="61 * * * *", enabled=False)
    Task.objects.update(next_run_at=None)
    code, output = status("--json")
    assert code == 7
    assert json.loads(output)["unschedulable"] == {"count": 2, "task_ids": ["bad-cron", "bad-zone"]}
    from tests.test_metrics import scrape, value

    assert value(scrape(), "scheduler_tasks_unschedulable") == 2


def test_late_runs_and_tasks_behind_follow_each_tasks_misfire_grace(clock):
    import json

    now = db.probe().now
    runner_record("a", now, now + timedelta(minutes=5))
    scheduler.register(definition("patient", cron="0 0 1 1 *", misfire_grace_seconds=3600))
    scheduler.register(definition("strict", cron="0 0 1 1 *", misfire_grace_seconds=10))
    for task_id in ("patient", "strict"):
        execution = scheduler.trigger(task_id)
        Execution.objects.filter(sequence=execution.sequence).update(due_at=now - timedelta(minutes=2))
    Task.objects.update(next_run_at=now - timedelta(minutes=2))
    code, output = status("--json")
    assert code == 3
    assert json.loads(output)["late"]["pending"] == 1 and json.loads(output)["late"]["tasks_behind"] == 1
    Task.objects.filter(id="strict").update(misfire_grace_seconds=None)  # the setting's 60 s
    assert json.loads(status("--json")[1])["late"]["tasks_behind"] == 1
    Task.objects.filter(id="strict").update(misfire_grace_seconds=600)
    assert status()[0] == 0


def test_scheduler_status_json_is_one_document_with_every_figure():
    import json

    now = db.probe().now
    runner_record("a", now, now + timedelta(minutes=5))
    code, output = status("--json")
    body = json.loads(output)
    assert code == 0 and body["ok"] is True and body["conditions"] == []
    assert body["runners"][0]["node_id"] == "a" and body["runners"][0]["state"] == "alive"
    assert body["unknown"] == {"count": 0, "oldest_updated_at": None}
    assert body["late"] == {"pending": 0, "oldest_due_at": None, "tasks_behind": 0}
    assert body["log_failures"] == {"count": 0}
    RunnerRecord.objects.update(silent_after=now - timedelta(seconds=1))
    code, output = status("--json")
    assert code == 2 and [c["name"] for c in json.loads(output)["conditions"]] == [
        "no_live_runner",
        "silent_runners",
    ]


def test_a_runner_backs_off_while_the_database_is_down_and_recovers():
    scheduler.register(definition(cron="0 0 1 1 *"))
    execution = scheduler.trigger("report", params={"result": "back"})
    real_probe = db.probe
    outages = iter(range(3))

    def failing_probe(*args, **kwargs):
        if next(outages, None) is not None:
            raise OperationalError("server closed the connection")
        return real_probe(*args, **kwargs)

    runner = SchedulerLoop(node_id="patient", workers=1, tick_interval=0.01)
    with (
        mock.patch.object(db, "probe", failing_probe),
        mock.patch("scheduler_app.runner.loop.MAX_BACKOFF", 0.05),
    ):
        thread = threading.Thread(target=runner.run, daemon=True)
        thread.start()
        wait_for(lambda: Execution.objects.get(sequence=execution.sequence).status == "success")
        runner.shutdown()
        thread.join(10)
    assert not thread.is_alive()
