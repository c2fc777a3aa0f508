"""Runner memory: the peak RSS of `run_scheduler` in a new project, every setting at its default.

The project is what `django-admin startproject` makes, with scheduler_app added to INSTALLED_APPS
and nothing else (the admin and its apps stay, as a new project has them). For each database
(SQLite, and PostgreSQL at PGHOST/PGPORT unless --no-postgres) one runner starts with the default
worker count and runs, in order:

- idle: nothing, for --seconds;
- python: 200 triggers of a registered no-op function (the python handler).

What the JavaScript pool adds when js tasks run is not measured here yet.

After each phase it prints the runner's peak RSS (VmHWM) so far, in MiB.

Run (from the repository root):

    .venv/bin/python bench/runner_rss.py [--seconds 10] [--no-postgres]

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
from pathlib import Path
from typing import Any

from _common import vm_hwm_kb, wait_until, write_results

SETTINGS = """
INSTALLED_APPS += ["scheduler_app", "jobs_app"]
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
elif command == "trigger":
    scheduler.trigger_many(sys.argv[2], [{} for _ in range(int(sys.argv[3]))])
elif command == "left":
    print(Execution.objects.exclude(status__in=["success", "failed", "interrupted"]).count())
"""


def mib(kb: int | None) -> float | None:
    return None if kb is None else round(kb / 1024, 1)


def one_database(args: argparse.Namespace, database: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rss-project-") as folder:
        project = Path(folder)
        python = sys.executable
        subprocess.run([python, "-m", "django", "startproject", "proj", str(project)], check=True)
        (project / "jobs_app").mkdir()
        (project / "jobs_app" / "__init__.py").write_text("")
        (project / "jobs_app" / "jobs.py").write_text(textwrap.dedent(JOBS))
        settings = SETTINGS
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
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "proj.settings", "PYTHONPATH": str(project)}
        env.pop("SCHEDULER_TEST_DB", None)

        def manage(*argv: str) -> str:
            done = subprocess.run(
                [python, "-c", PROBE, *argv], cwd=project, env=env, check=True, capture_output=True, text=True
            )
            return done.stdout

        try:
            subprocess.run([python, "-m", "django", "migrate", "-v0"], cwd=project, env=env, check=True)
            manage("register")
            runner = subprocess.Popen(
                [python, "-m", "django", "run_scheduler"],
                cwd=project,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            figures: dict[str, Any] = {"database": database}
            try:
                time.sleep(args.seconds)  # a measurement window, not a synchronisation
                figures["idle"] = mib(vm_hwm_kb(runner.pid))
                manage("trigger", "py", "200")
                wait_until(lambda: manage("left").strip() == "0", 120)
                figures["python"] = mib(vm_hwm_kb(runner.pid))
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
    args = parser.parse_args()
    results = {}
    for database in ["sqlite"] + ([] if args.no_postgres else ["postgres"]):
        figures = one_database(args, database)
        results[database] = figures
        print(
            f"{database}: runner peak RSS idle {figures['idle']} MiB, after 200 python runs {figures['python']} MiB"
        )
    write_results("runner_rss", results)


if __name__ == "__main__":
    main()
