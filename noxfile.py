"""The support matrix: the test suite on each supported Python x Django combination.

    nox -s tests                                   every combination (no process tests, SQLite)
    nox -t older                                   every combination but the newest
    nox -s "tests(python='3.13', django='6.1')"    one of them
    nox -s tests -- --db postgres                  another database for the pytest run

Django 6.x needs Python 3.12+. Interpreters are taken from PATH, else from pyenv's
versions folder (this project's machines have 3.11, 3.12 and 3.13 there).
The CI command (tests/run_all.sh) runs the whole suite on the newest combination, on SQLite,
PostgreSQL and MariaDB, and ``nox -t older`` beside it. setup.cfg's classifiers name exactly the
Pythons and Djangos of MATRIX (tests/test_packaging.py).
"""

from __future__ import annotations

import glob
import os

import nox

DJANGO = {"5.2": "Django>=5.2,<5.3", "6.0": "Django>=6.0,<6.1", "6.1": "Django>=6.1,<6.2"}
PYTHONS = ("3.11", "3.12", "3.13")
MATRIX = [(python, django) for python in PYTHONS for django in DJANGO if django == "5.2" or python >= "3.12"]
NEWEST = MATRIX[-1]

nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True


def use_pyenv_interpreters() -> None:
    """Put pyenv's newest X.Y.* of each supported version first on PATH: its shims answer only the
    versions pyenv has selected, and nox looks for ``pythonX.Y`` on PATH."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    folders = []
    for version in PYTHONS:
        found = sorted(glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", f"python{version}")))
        if found:
            folders.append(os.path.dirname(found[-1]))
    os.environ["PATH"] = os.pathsep.join([*folders, os.environ.get("PATH", "")])


use_pyenv_interpreters()


@nox.session
@nox.parametrize(
    ("python", "django"),
    [nox.param(*pair, tags=["newest" if pair == NEWEST else "older"]) for pair in MATRIX],
)
def tests(session: nox.Session, django: str) -> None:
    """The suite without real runner processes, minute waits, the browser or the demo, on one combination."""
    database = "sqlite"
    arguments = list(session.posargs)
    if "--db" in arguments:
        index = arguments.index("--db")
        database = arguments[index + 1]
        del arguments[index : index + 2]
    session.install("-q", "-r", "requirements-dev.txt", DJANGO[django])
    session.run("python", "-m", "django", "--version")
    session.run(
        "python",
        "-m",
        "pytest",
        "-q",
        "--ignore=tests/system",
        # testproject/run.sh runs on the checkout's .venv (the newest combination), not this session's.
        "--ignore=tests/test_demo_project.py",
        "-m",
        "not processes and not minute and not browser",
        *arguments,
        env={
            "PYTHONPATH": os.getcwd(),
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "SCHEDULER_TEST_DB": database,
            "SCHEDULER_TEST_DB_NAME": f"nox_{session.python}_{django}".replace(".", ""),
        },
    )
