"""The README's five-minute tour, then the REST set-up of docs/rest_api.md, run as written in a new project.

The steps are the fenced blocks marked ``<!-- tour: ACTION [PATH] -->`` in README.md, then in
docs/rest_api.md, in order:

- ``run``: commands, one a line; ``cd DIR`` moves on; ``python`` and ``django-admin`` are this
  interpreter's, and no other program may be run;
- ``append PATH``, ``create PATH``: a file, relative to the current directory;
- ``shell``: Python run by ``python manage.py shell``; the comment after a ``print(...)`` is what it
  prints.

The project uses SQLite whatever the suite's database, so the module runs on the SQLite pass only
(``SCHEDULER_TEST_DB`` sqlite or unset).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
REST_API = ROOT / "docs" / "rest_api.md"
MARKER = re.compile(
    r"<!-- tour: (?P<action>[^>]*?) -->\n```(?P<language>\w*)\n(?P<body>.*?)\n```\n", re.DOTALL
)
PRINTED = re.compile(r"^\s*print\(.*\)\s+# (?P<shown>.+)$", re.MULTILINE)
TOKEN = re.compile(r"Generated token (?P<token>\w+) for user billing-bot")
DASHBOARD = "/admin/scheduler_app/"
TIMEOUT = 60
# The schema and its page are there with the openapi extra only.
SPECTACULAR = importlib.util.find_spec("drf_spectacular") is not None
SIDECAR = importlib.util.find_spec("drf_spectacular_sidecar") is not None

pytestmark = pytest.mark.skipif(
    os.environ.get("SCHEDULER_TEST_DB", "sqlite") not in ("", "sqlite"),
    reason="the tour's project runs on SQLite: once per CI run, on the SQLite pass",
)


@dataclass(frozen=True)
class Step:
    action: str
    path: str
    body: str


def tour_steps(document: Path) -> list[Step]:
    """The marked blocks of ``document``; a marker without a block right after it is an error."""
    text = document.read_text()
    steps = []
    for match in MARKER.finditer(text):
        action, _, path = match["action"].partition(" ")
        assert action in ("run", "append", "create", "shell"), match[0]
        assert bool(path) == (action in ("append", "create")), match[0]
        steps.append(Step(action, path, match["body"]))
    assert len(steps) == text.count("<!-- tour:"), f"a tour marker of {document.name} is not before a block"
    return steps


@dataclass
class Project:
    """The directory the tour is in, and what each step printed."""

    cwd: Path
    outputs: list[str] = field(default_factory=list)

    def environment(self) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if not key.startswith("DJANGO_")}
        # The checkout's scheduler_app, whether or not it is installed.
        env["PYTHONPATH"] = str(ROOT)
        return env

    def execute(self, command: list[str], stdin: str | None = None) -> str:
        done = subprocess.run(
            command,
            cwd=self.cwd,
            env=self.environment(),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, (
            f"{shlex.join(command)} in {self.cwd} exited {done.returncode}:\n{output}"
        )
        self.outputs.append(output)
        return output

    def manage(self, *arguments: str) -> str:
        return self.execute([sys.executable, "manage.py", *arguments])

    def apply(self, step: Step) -> str:
        if step.action == "run":
            return "".join(self.command(line) for line in step.body.splitlines())
        if step.action in ("append", "create"):
            target = self.cwd / step.path
            assert target.exists() == (step.action == "append"), f"{step.action} {target}"
            with target.open("a") as file:
                file.write(f"\n{step.body}\n")
            return ""
        output = self.manage("shell", "-c", step.body)
        position = 0
        for shown in PRINTED.finditer(step.body):
            position = output.find(shown["shown"], position)
            assert position >= 0, f"{shown['shown']!r} is not in what the block printed:\n{output}"
        return output

    def command(self, line: str) -> str:
        words = shlex.split(line, comments=True)
        if not words:
            return ""
        program, *arguments = words
        if program == "cd":
            [directory] = arguments
            self.cwd = self.cwd / directory
            return ""
        programs = {"python": [sys.executable], "django-admin": [sys.executable, "-m", "django"]}
        assert program in programs, f"the tour runs {program}, which this test does not know: {line}"
        return self.execute([*programs[program], *arguments])

    def python(self, script: str) -> dict[str, Any]:
        """Run ``script`` in the project's shell; it prints one JSON line starting with RESULT."""
        output = self.manage("shell", "-c", script)
        [line] = [line for line in output.splitlines() if line.startswith("RESULT ")]
        return dict(json.loads(line.removeprefix("RESULT ")))

    def rows(self, query: str) -> list[tuple[object, ...]]:
        with sqlite3.connect(self.cwd / "db.sqlite3") as connection:
            return connection.execute(query).fetchall()


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    """A new project, after every step of the README's tour."""
    tour = Project(tmp_path_factory.mktemp("tour"))
    for step in tour_steps(README):
        tour.apply(step)
    yield tour


EXECUTIONS = (
    "SELECT trigger_type, trigger_source, status, attempt, result FROM scheduler_app_execution"
    " WHERE task_id = 'nightly-report' AND trigger_type = 'manual' ORDER BY sequence"
)
LOGS = (
    "SELECT trigger_source, status, result FROM scheduler_app_executionlog"
    " WHERE task_id = 'nightly-report' AND trigger_type = 'manual' ORDER BY started_at"
)


def test_the_readme_tour_runs_its_declared_task(project):
    assert "System check identified no issues" in project.manage("check")
    assert any("report sent to #ops" in output for output in project.outputs)
    [execution] = project.rows(EXECUTIONS)
    assert execution[:4] == ("manual", "billing", "success", 1)
    assert json.loads(str(execution[4])) == {"sent": True}
    [log] = project.rows(LOGS)
    assert log[:2] == ("billing", "success") and json.loads(str(log[2])) == {"sent": True}
    [(declared_in, handler)] = project.rows(
        "SELECT declared_in, handler FROM scheduler_app_task WHERE id = 'nightly-report'"
    )
    assert declared_in == "code"
    assert json.loads(str(handler)) == {"kind": "python", "function": "nightly-report", "timeout": 600}


def test_the_dashboard_is_where_the_readme_says(project):
    assert DASHBOARD in README.read_text()
    answer = project.python(
        "import json\n"
        "from django.contrib.auth.models import User\n"
        "from django.test import Client\n"
        "client = Client(HTTP_HOST='localhost')\n"
        "client.force_login(User.objects.create_superuser('tour-admin'))\n"
        f"response = client.get({DASHBOARD!r})\n"
        "print('RESULT ' + json.dumps({'status': response.status_code,"
        " 'dashboard': 'id=\"scheduler-unknown\"' in response.content.decode()}))\n"
    )
    assert answer == {"status": 200, "dashboard": True}


API_CALLS = """
import json
from django.test import Client

api = Client(HTTP_AUTHORIZATION="Token " + TOKEN, HTTP_HOST="localhost")
base = "/api/scheduler/"
trigger = {"source": "api", "idempotency_key": "2026-11"}
answers = {}
for name, method, path, body in [
    ("list", "get", "tasks/", None),
    ("trigger", "post", "tasks/nightly-report/trigger/", trigger),
    ("again", "post", "tasks/nightly-report/trigger/", trigger),
    ("create", "post", "tasks/", {"id": "other", "cron": "0 3 * * *"}),
    ("nowhere", "get", "nope/", None),
    ("schema", "get", "schema/", None),
    ("docs", "get", "schema/docs/", None),
]:
    if body is None:
        response = getattr(api, method)(base + path)
    else:
        response = getattr(api, method)(base + path, json.dumps(body), content_type="application/json")
    is_json = response["Content-Type"].startswith("application/json")
    answers[name] = [response.status_code, response.json() if is_json else None]
print("RESULT " + json.dumps(answers))
"""


def test_the_rest_api_set_up_runs_as_written_after_the_tour(project):
    steps = tour_steps(REST_API)
    assert {step.action for step in steps} == {"append", "run", "shell"}
    for step in steps:
        project.apply(step)
    [token] = {match["token"] for output in project.outputs for match in TOKEN.finditer(output)}
    answers = project.python(f"TOKEN = {token!r}\n{API_CALLS}")
    status = {name: answer[0] for name, answer in answers.items()}
    assert status == {
        "list": 200,
        "trigger": 202,
        "again": 200,
        "create": 403,
        "nowhere": 404,
        "schema": 200 if SPECTACULAR else 404,
        "docs": 200 if SPECTACULAR and SIDECAR else 404,
    }
    assert [task["id"] for task in answers["list"][1]["results"]] == ["nightly-report"]
    assert answers["create"][1] == {
        "code": "permission_denied",
        "message": "Missing permission: scheduler_app.add_task.",
    }
    assert answers["nowhere"][1]["code"] == "not_found"
    project.manage("run_scheduler", "--once")
    assert [row[:3] for row in project.rows(EXECUTIONS)] == [
        ("manual", "billing", "success"),
        ("manual", "api", "success"),
    ]
