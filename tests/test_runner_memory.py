"""What a runner keeps in memory: only the libraries of the handler kinds it runs, and a short
statement log under DEBUG (bench/runner_rss.py measures the resulting RSS)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.db import connection
from django.test import override_settings

from scheduler_app.handlers import BUILTIN, registry
from scheduler_app.handlers.fake import FakeHandler
from scheduler_app.handlers.python import PythonHandler
from scheduler_app.management.commands.run_scheduler import DEBUG_STATEMENTS_KEPT, few_statements_logged

ROOT = Path(__file__).resolve().parent.parent

# What a runner that runs only python tasks never needs: the API's DRF (and pygments, which DRF's
# template tags import), the api kind's HTTP client, the js kind's handler, pool and V8, and Redis
# (no REDIS_URL).
NOT_IMPORTED = [
    "rest_framework",
    "rest_framework.views",
    "requests",
    "urllib3",
    "pygments",
    "py_mini_racer",
    "redis",
    "scheduler_app.api",
    "scheduler_app.handlers.http",
    "scheduler_app.handlers.javascript",
    "scheduler_app.handlers.js_pool",
]
JOBS = """
from scheduler_app import job


@job("noop")
def noop(event):
    return "done"
"""
PREPARE = """
import django
django.setup()
from django.core.management import call_command
from scheduler_app import scheduler
call_command("migrate", verbosity=0)
scheduler.register({"id": "py", "cron": "0 0 1 1 *", "handler": {"kind": "python", "function": "noop"}})
scheduler.trigger("py")
"""
RUN = f"""
import sys, django
django.setup()
from django.core.management import call_command
call_command("run_scheduler", "--once", "--verbosity", "0", skip_checks=False)
from scheduler_app.models import Execution
print(Execution.objects.get().result)
print(*sorted(name for name in {NOT_IMPORTED!r} if name in sys.modules))
"""


@pytest.mark.parametrize("rest_api", [False, True], ids=["new project", "REST API mounted"])
def test_a_runner_of_python_tasks_imports_no_other_kinds_library(tmp_path, rest_api):
    """A project as startproject makes it (the admin included), with scheduler_app and one @job; and
    the same with the REST API mounted as docs/rest_api.md says, whose URLconf and DRF the runner's
    start-up checks leave to the web side."""
    subprocess.run([sys.executable, "-m", "django", "startproject", "proj", str(tmp_path)], check=True)
    (tmp_path / "jobs_app").mkdir()
    (tmp_path / "jobs_app" / "__init__.py").write_text("")
    (tmp_path / "jobs_app" / "jobs.py").write_text(JOBS)
    with open(tmp_path / "proj" / "settings.py", "a") as settings:
        settings.write('\nINSTALLED_APPS += ["scheduler_app", "jobs_app"]\n')
        if rest_api:
            settings.write('INSTALLED_APPS += ["rest_framework"]\n')
    if rest_api:
        with open(tmp_path / "proj" / "urls.py", "a") as urls:
            urls.write('\nurlpatterns += [path("api/scheduler/", include("scheduler_app.api.urls"))]\n')
            urls.write("from django.urls import include\n")
    env = {
        **os.environ,
        "PYTHONPATH": f"{tmp_path}:{ROOT}",
        "DJANGO_SETTINGS_MODULE": "proj.settings",
    }
    subprocess.run([sys.executable, "-c", PREPARE], cwd=tmp_path, env=env, check=True, timeout=120)
    done = subprocess.run(
        [sys.executable, "-c", RUN], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    # The task ran, and nothing on the list was imported to run it (DRF's app itself is installed).
    assert done.stdout.splitlines() == ["done", "rest_framework" if rest_api else ""]


class CountedHandler(FakeHandler):
    made = 0

    def __init__(self) -> None:
        CountedHandler.made += 1


def test_each_handler_kind_is_loaded_on_its_first_use_only():
    handlers = {"counted": "tests.test_runner_memory.CountedHandler"}
    with override_settings(SCHEDULER_APP={"HANDLERS": handlers}):
        CountedHandler.made = 0
        assert isinstance(registry.for_config({"kind": "python"}), PythonHandler)
        assert CountedHandler.made == 0  # another kind's use loads only that kind
        handler = registry.get("counted")
        assert registry.get("counted") is handler
        assert CountedHandler.made == 1


def test_a_kind_that_cannot_be_imported_is_logged_once_and_left_out(caplog):
    handlers = {"fake": "scheduler_app.handlers.fake.FakeHandler", "broken": "tests.no_such_module.Handler"}
    with (
        override_settings(SCHEDULER_APP={"HANDLERS": handlers}),
        caplog.at_level(logging.ERROR, "scheduler_app"),
    ):
        assert registry.get("broken") is None
        assert registry.get("broken") is None
        assert registry.get("telepathy") is None
        assert registry.kinds() == sorted([*BUILTIN, "fake"])
    assert [record.getMessage() for record in caplog.records] == [
        "handler kind 'broken' cannot be imported from 'tests.no_such_module.Handler'"
    ]


@pytest.mark.django_db(transaction=True)
def test_under_debug_the_connections_the_runner_opens_log_only_their_last_statements():
    logged: dict[str, int] = {}

    def new_connection(name: str) -> None:
        # A thread of its own opens a connection of its own, as each of the runner's threads does.
        try:
            for _ in range(DEBUG_STATEMENTS_KEPT + 5):
                with connection.cursor() as cursor:
                    cursor.execute("SELECT 1")
            logged[name] = len(connection.queries_log)
        finally:
            connection.close()

    def in_a_thread(name: str) -> None:
        thread = threading.Thread(target=new_connection, args=(name,))
        thread.start()
        thread.join()

    with override_settings(DEBUG=True):
        with few_statements_logged():
            in_a_thread("runner")
        in_a_thread("elsewhere")
    assert logged["runner"] == DEBUG_STATEMENTS_KEPT
    assert logged["elsewhere"] > DEBUG_STATEMENTS_KEPT  # Django's own limit, outside the command
