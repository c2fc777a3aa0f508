"""Runner memory: the peak RSS of `run_scheduler` in a new project, every setting at its default.

The project is what `django-admin startproject` makes, with scheduler_app added to INSTALLED_APPS
and nothing else (the admin and its apps stay, as a new project has them); with --rest-api, also
the REST API as docs/rest_api.md mounts it (rest_framework installed, the API's URLs included).
For each database (SQLite, and PostgreSQL at PGHOST/PGPORT unless --no-postgres) one runner starts
with the default worker count and runs, in order:

- idle: nothing, for --seconds;
- python: 200 triggers of a registered no-op function (the python handler);
- js (with --js): 200 triggers of a js task, ``() => 1``: the js handler runs each in a child
  process of the runner (V8 through mini-racer), kept for the next one.

Beside it, the floor: the peak RSS of a process of the same project without scheduler_app that sets
up Django, runs the system checks run_scheduler runs first (all but the web side's,
scheduler_app/management/base.py) and opens its database connection; what the runner adds to
Django, its database driver and the project's apps is above it.

After each phase it prints the runner's peak RSS (VmHWM) so far, in MiB; after the js phase also
how many JavaScript child processes the runner has and their peak RSS, each at most and together,
and how much of their memory is theirs alone (the V8 library's pages are shared between them).
The runner imports scheduler_app from this checkout, whatever the virtualenv has installed.

Run (from the repository root):

    .venv/bin/python bench/runner_rss.py [--seconds 10] [--no-postgres] [--js] [--rest-api]

Writes bench/results/runner_rss.json.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

from _common import ROOT, vm_hwm_kb, wait_until, write_results

SETTINGS = """
INSTALLED_APPS += ["scheduler_app", "jobs_app"]
"""
# docs/rest_api.md's set-up.
REST_API_SETTINGS = """
INSTALLED_APPS += ["rest_framework"]
"""
REST_API_URLS = """
from django.urls import include, path

urlpatterns += [path("api/scheduler/", include("scheduler_app.api.urls"))]
"""
JOBS = """
from scheduler_app import job


@job("noop")
def noop(event):
    return None
"""
PROBE = """
import sys, django
django.setup()
from scheduler_app import scheduler
from scheduler_app.models import Execution
command = sys.argv[1]
if command == "register":
    scheduler.register({"id": "py", "cron": "0 0 1 1 *", "max_concurrency": 8,
                        "handler": {"kind": "python", "function": "noop"}})
elif command == "register-js":
    scheduler.register({"id": "js", "cron": "0 0 1 1 *", "max_concurrency": 8,
                        "handler": {"kind": "js", "code": "() => 1"}})
elif command == "trigger":
    scheduler.trigger_many(sys.argv[2], [{} for _ in range(int(sys.argv[3]))])
elif command == "left":
    print(Execution.objects.exclude(status__in=["success", "failed", "interrupted"]).count())
"""

# The same project without scheduler_app: setup, the checks run_scheduler runs first, one connection.
FLOOR = """
import re, django
from django.conf import settings
from django.core import checks
from django.db import connection
from scheduler_app.management.base import start_up_check_tags
settings.INSTALLED_APPS = [app for app in settings.INSTALLED_APPS if app not in ("scheduler_app", "jobs_app")]
django.setup()
checks.run_checks(tags=start_up_check_tags(), databases=[])
connection.ensure_connection()
print(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1))
"""


def mib(kb: int | None) -> float | None:
    return None if kb is None else round(kb / 1024, 1)


def children(pid: int) -> list[int]:
    """The process ids of ``pid``'s children (its JavaScript processes)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with suppress(OSError):
            found += [int(child) for child in (task / "children").read_text().split()]
    return found


def private_kb(pid: int) -> int:
    """Memory ``pid`` maps that no other process maps (its V8 library's pages are shared), in kB."""
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        return sum(
            int(line.split()[1]) for line in rollup if line.startswith(("Private_Clean:", "Private_Dirty:"))
        )


def one_database(args: argparse.Namespace, database: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rss-project-") as folder:
        project = Path(folder)
        python = sys.executable
        subprocess.run([python, "-m", "django", "startproject", "proj", str(project)], check=True)
        (project / "jobs_app").mkdir()
        (project / "jobs_app" / "__init__.py").write_text("")
        (project / "jobs_app" / "jobs.py").write_text(textwrap.dedent(JOBS))
        settings = SETTINGS + (REST_API_SETTINGS if args.rest_api else "")
        if args.rest_api:
            with open(project / "proj" / "urls.py", "a") as urls:
                urls.write(REST_API_URLS)
        name = f"bench_rss_{os.getpid()}"
        if database == "postgres":
            settings += textwrap.dedent(f"""
                DATABASES = {{"default": {{"ENGINE": "django.db.backends.postgresql", "NAME": "{name}",
                    "USER": "postgres", "HOST": "{os.environ.get("PGHOST", "127.0.0.1")}",
                    "PORT": "{os.environ.get("PGPORT", "5432")}"}}}}
            """)
            subprocess.run(
                ["psql", "-h", "127.0.0.1", "-U", "postgres", "-c", f"CREATE DATABASE {name}"],
                check=True,
                capture_output=True,
            )
        else:
            settings += 'DATABASES["default"]["OPTIONS"] = {"transaction_mode": "IMMEDIATE", "timeout": 20}\n'
        with open(project / "proj" / "settings.py", "a") as handle:
            handle.write(settings)
        # This checkout's scheduler_app, not whichever the virtualenv has installed.
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "proj.settings", "PYTHONPATH": f"{project}:{ROOT}"}
        env.pop("SCHEDULER_TEST_DB", None)

        def manage(*argv: str) -> str:
            done = subprocess.run(
                [python, "-c", PROBE, *argv], cwd=project, env=env, check=True, capture_output=True, text=True
            )
            return done.stdout

        try:
            subprocess.run([python, "-m", "django", "migrate", "-v0"], cwd=project, env=env, check=True)
            manage("register")
            if args.js:
                manage("register-js")
            runner = subprocess.Popen(
                [python, "-m", "django", "run_scheduler"],
                cwd=project,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            floor = subprocess.run(
                [python, "-c", FLOOR], cwd=project, env=env, check=True, capture_output=True, text=True
            )
            figures: dict[str, Any] = {"database": database, "floor": mib(int(floor.stdout))}
            try:
                time.sleep(args.seconds)  # a measurement window, not a synchronisation
                figures["idle"] = mib(vm_hwm_kb(runner.pid))
                manage("trigger", "py", "200")
                wait_until(lambda: manage("left").strip() == "0", 120)
                figures["python"] = mib(vm_hwm_kb(runner.pid))
                if args.js:
                    manage("trigger", "js", "200")
                    wait_until(lambda: manage("left").strip() == "0", 120)
                    figures["js"] = mib(vm_hwm_kb(runner.pid))
                    pids = children(runner.pid)
                    peaks = [mib(vm_hwm_kb(child)) or 0.0 for child in pids]
                    figures["js_processes"] = {
                        "count": len(peaks),
                        "each_at_most": max(peaks, default=None),
                        "together": round(sum(peaks), 1),
                        "private_now": mib(sum(private_kb(child) for child in pids)),
                    }
            finally:
                runner.terminate()
                runner.wait(60)
        finally:
            if database == "postgres":
                subprocess.run(
                    ["psql", "-h", "127.0.0.1", "-U", "postgres", "-c", f"DROP DATABASE IF EXISTS {name}"],
                    check=False,
                    capture_output=True,
                )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--js", action="store_true", help="then 200 js runs: the runner and its V8 processes")
    parser.add_argument("--rest-api", action="store_true", help="the project mounts the REST API")
    args = parser.parse_args()
    results: dict[str, Any] = {"rest_api": args.rest_api}
    for database in ["sqlite"] + ([] if args.no_postgres else ["postgres"]):
        figures = one_database(args, database)
        results[database] = figures
        print(
            f"{database}: runner peak RSS idle {figures['idle']} MiB, after 200 python runs {figures['python']} MiB"
            f" (floor: Django and the project without scheduler_app {figures['floor']} MiB)"
            + (", REST API mounted" if args.rest_api else "")
        )
        if args.js:
            js = figures["js_processes"]
            print(
                f"{database}: after 200 js runs, runner {figures['js']} MiB and {js['count']} JavaScript"
                f" processes of {js['each_at_most']} MiB at most, {js['together']} MiB together"
                f" ({js['private_now']} MiB of it private to them now)"
            )
    write_results("runner_rss", results)


if __name__ == "__main__":
    main()
