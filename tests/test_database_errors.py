"""Database errors name their cause: each real failure of SQLite, PostgreSQL and MariaDB, without secrets.

Each case makes the driver fail for real (a refused port, a wrong password, a
missing table, a held SQLite lock) in a child process with a database alias per case.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "pw-Secret-4711"

pytestmark = pytest.mark.skipif(
    os.environ.get("SCHEDULER_TEST_DB", "sqlite") != "sqlite",
    reason="runs once per suite run, in the SQLite pass (it reaches every server itself)",
)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def postgres(**overrides: str) -> dict[str, str]:
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "test",
        "USER": os.environ.get("PGUSER", "postgres"),
        "HOST": os.environ.get("PGHOST", "127.0.0.1"),
        "PORT": os.environ.get("PGPORT", "5432"),
        **overrides,
    }


def mysql(**overrides: str) -> dict[str, str]:
    return {
        "ENGINE": "django.db.backends.mysql",
        "NAME": "mysql",
        "USER": "root",
        "HOST": os.environ.get("MYSQL_HOST", "127.0.0.1"),
        "PORT": os.environ.get("MYSQL_PORT", "3306"),
        **overrides,
    }


SCRIPT = """
import json, sqlite3, sys
import django
from django.conf import settings

databases = json.loads(sys.argv[1])
settings.configure(DATABASES=databases, INSTALLED_APPS=[], USE_TZ=True)
django.setup()
from django.db import connections
from scheduler_app.database_errors import cause_of, describe

if "sqlite_locked" in databases:
    holder = sqlite3.connect(databases["sqlite_locked"]["NAME"])
    holder.execute("CREATE TABLE IF NOT EXISTS t (x integer)")
    holder.commit()
    holder.execute("BEGIN EXCLUSIVE")
found = {}
for alias in databases:
    if alias == "default":
        continue
    statement = {
        "sqlite_locked": "INSERT INTO t VALUES (1)",
        "sqlite_old_schema": "SELECT next_run_at FROM scheduler_app_task",
    }.get(alias, "SELECT 1 FROM scheduler_app_task")
    try:
        with connections[alias].cursor() as cursor:
            cursor.execute(statement)
    except Exception as exc:
        found[alias] = [cause_of(exc), describe(exc, alias)]
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def port() -> int:
    return closed_port()


@pytest.fixture(scope="module")
def described(tmp_path_factory, port) -> dict[str, list[str]]:
    folder = tmp_path_factory.mktemp("database_errors")
    sqlite3.connect(folder / "empty.sqlite3").close()
    with sqlite3.connect(folder / "old.sqlite3") as old:
        old.execute("CREATE TABLE scheduler_app_task (id text)")  # as before a migration added columns
    databases = {
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(folder / "default.sqlite3")},
        "sqlite_missing_tables": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(folder / "empty.sqlite3"),
        },
        "sqlite_locked": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(folder / "locked.sqlite3"),
            "OPTIONS": {"timeout": 0.1},
        },
        "sqlite_old_schema": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(folder / "old.sqlite3")},
        "sqlite_cannot_open": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(folder / "no-such-folder" / "db.sqlite3"),
        },
        "postgres_refused": postgres(PORT=str(port), PASSWORD=PASSWORD),
        "postgres_unknown_database": postgres(NAME="no_such_database_here", PASSWORD=PASSWORD),
        "postgres_unknown_role": postgres(USER="no_such_role_here", PASSWORD=PASSWORD),
        "postgres_unknown_host": postgres(HOST="no-such-host.invalid", PASSWORD=PASSWORD),
        "postgres_missing_tables": postgres(PASSWORD=""),
        "mysql_refused": mysql(PORT=str(port), PASSWORD=PASSWORD),
        "mysql_access_denied": mysql(PASSWORD=PASSWORD),
        "mysql_unknown_database": mysql(NAME="no_such_database_here"),
        "mysql_missing_tables": mysql(),
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(databases)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    ("alias", "cause", "says"),
    [
        ("sqlite_missing_tables", "missing_tables", "tables do not exist in SQLite database"),
        ("sqlite_locked", "locked", "'transaction_mode': 'IMMEDIATE'"),
        ("sqlite_old_schema", "old_schema", "are older than this version: run `manage.py migrate`"),
        ("sqlite_cannot_open", "cannot_open", "cannot be opened"),
        ("postgres_refused", "refused", "connection refused"),
        ("postgres_unknown_database", "unknown_database", "'no_such_database_here' at"),
        ("postgres_unknown_role", "unknown_role", "has no user 'no_such_role_here'"),
        ("postgres_unknown_host", "unknown_host", "the host name does not resolve"),
        ("postgres_missing_tables", "missing_tables", "run `manage.py migrate`"),
        ("mysql_refused", "refused", "connection refused"),
        ("mysql_access_denied", "access_denied", "refused the credentials of user 'root'"),
        ("mysql_unknown_database", "unknown_database", "does not exist: create it or check NAME"),
        ("mysql_missing_tables", "missing_tables", "run `manage.py migrate`"),
    ],
)
def test_each_failure_is_named_with_its_fix(described, alias, cause, says):
    found_cause, message = described[alias]
    assert found_cause == cause
    assert says in message


def test_a_network_failure_names_the_host_and_port(described, port):
    assert "no-such-host.invalid:5432" in described["postgres_unknown_host"][1]
    assert f"postgresql database 'test' at 127.0.0.1:{port} " in described["postgres_refused"][1]
    assert f"mysql database 'mysql' at 127.0.0.1:{port} " in described["mysql_refused"][1]


def test_no_password_driver_text_or_sql_is_shown(described):
    for _, message in described.values():
        assert PASSWORD not in message
        assert "SELECT" not in message and "scheduler_app_task" not in message
        # Driver phrasings (libpq's, MySQL's) stay inside the classification.
        assert "FATAL" not in message and "Access denied" not in message and "(2002" not in message


def write_settings(folder: Path, databases: dict[str, dict[str, str]]) -> dict[str, str]:
    """A settings module: the test settings with these DATABASES; returns the child's environment."""
    (folder / "broken_settings.py").write_text(
        textwrap.dedent(
            f"""
            from tests.settings import *  # noqa: F403

            DATABASES = {databases!r}
            """
        )
    )
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)]),
        "DJANGO_SETTINGS_MODULE": "broken_settings",
    }


def manage(env: dict[str, str], *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )


def test_run_scheduler_once_on_a_database_never_migrated_exits_1_saying_run_migrate(tmp_path):
    sqlite = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "new.sqlite3")}
    env = write_settings(tmp_path, {"default": sqlite, "logs": sqlite})
    done = manage(env, "run_scheduler", "--once")
    assert done.returncode == 1
    assert "cannot start: the scheduler's tables do not exist in SQLite database" in done.stderr
    assert "run `manage.py migrate`" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("settings", "named"), [(postgres, "postgresql database 'test'"), (mysql, "mysql database 'mysql'")]
)
def test_scheduler_status_names_the_database_it_could_not_reach(tmp_path, settings, named):
    port = closed_port()
    unreachable = settings(PORT=str(port), PASSWORD=PASSWORD)
    env = write_settings(tmp_path, {"default": unreachable, "logs": unreachable})
    done = manage(env, "scheduler_status")
    assert done.returncode == 1
    assert f"cannot connect to {named} at 127.0.0.1:{port}" in done.stderr
    assert "connection refused" in done.stderr
    assert "Traceback" not in done.stderr
    assert PASSWORD not in done.stderr + done.stdout


def test_run_scheduler_once_on_an_unreachable_mysql_exits_1_naming_it(tmp_path):
    """The start-up system checks read no database (Django 6.1 would ask MySQL for its version)."""
    port = closed_port()
    unreachable = mysql(PORT=str(port), PASSWORD=PASSWORD)
    env = write_settings(tmp_path, {"default": unreachable, "logs": unreachable})
    done = manage(env, "run_scheduler", "--once")
    assert done.returncode == 1
    assert f"cannot start: cannot connect to mysql database 'mysql' at 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr
    assert PASSWORD not in done.stderr + done.stdout
