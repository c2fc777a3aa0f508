"""The sdist and the wheel as built from this checkout: their files, their metadata, a clean build.

The artefacts do not depend on the database, so the module runs once per CI run, on the SQLite
pass (``SCHEDULER_TEST_DB`` sqlite or unset). It builds from a copy of the checkout, so the
checkout's own ``build/`` and ``*.egg-info`` are never read or written.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from email.message import Message
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = "https://github.com/django-scheduler-app/django-scheduler-app"

pytestmark = pytest.mark.skipif(
    os.environ.get("SCHEDULER_TEST_DB", "sqlite") not in ("", "sqlite"),
    reason="the packaging tests run once per CI run, on the SQLite pass",
)

# What a checkout holds besides its sources: at the top, then anywhere.
LOCAL_AT_TOP = {
    ".git",
    ".venv",
    "build",
    "dist",
    ".hypothesis",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".nox",
}
LOCAL_ANYWHERE = ("__pycache__", "*.egg-info", "*.sqlite3", "*.sqlite3-*", "*.py[cod]")


@dataclass(frozen=True)
class Built:
    """The artefacts of one build and what it printed."""

    sdist: Path
    wheel: Path
    output: str

    def sdist_files(self) -> set[str]:
        """The sdist's file names, relative to its top folder."""
        with tarfile.open(self.sdist) as archive:
            return {member.name.split("/", 1)[1] for member in archive.getmembers() if member.isfile()}

    def wheel_files(self) -> set[str]:
        with zipfile.ZipFile(self.wheel) as archive:
            return set(archive.namelist())

    def wheel_text(self, suffix: str) -> str:
        """The text of the one wheel file whose name ends with ``suffix``."""
        with zipfile.ZipFile(self.wheel) as archive:
            [name] = [name for name in archive.namelist() if name.endswith(suffix)]
            return archive.read(name).decode()

    def metadata(self) -> Message:
        return Parser().parsestr(self.wheel_text(".dist-info/METADATA"))


def _ignored(directory: str, names: list[str]) -> set[str]:
    ignored = shutil.ignore_patterns(*LOCAL_ANYWHERE)(directory, names)
    if Path(directory) == ROOT:
        ignored |= LOCAL_AT_TOP & set(names)
    return set(ignored)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """Build the sdist, then the wheel from that sdist, as ``python -m build`` does, without isolation."""
    work = tmp_path_factory.mktemp("packaging")
    source, out = work / "source", work / "dist"
    shutil.copytree(ROOT, source, ignore=_ignored)
    build = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )
    assert build.returncode == 0, build.stdout
    [sdist], [wheel] = out.glob("*.tar.gz"), out.glob("*.whl")
    return Built(sdist, wheel, build.stdout)


def checkout_files(folder: str) -> set[str]:
    """The files under ``folder`` of the checkout that are sources (not caches, not test artefacts)."""
    return {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / folder).rglob("*")
        if path.is_file()
        and path.suffix not in (".pyc", ".sqlite3")
        and not {"__pycache__", "artifacts", "results"} & set(path.relative_to(ROOT).parts)
    }


def test_the_license_ships_in_the_sdist_and_the_wheel(built):
    license_text = (ROOT / "LICENSE").read_text()
    assert license_text.startswith("BSD 3-Clause License\n\nCopyright (c) 2026, the scheduler_app authors\n")
    assert "LICENSE" in built.sdist_files()
    assert built.wheel_text(".dist-info/licenses/LICENSE") == license_text


def test_the_sdist_holds_the_whole_test_suite_with_its_conftest_settings_and_system_tests(built):
    files = built.sdist_files()
    assert {"tests/conftest.py", "tests/settings.py", "tests/factories.py", "tests/hooks.py"} <= files
    assert {"tests/system/processes.py", "tests/system/faults.py", "tests/system/test_processes.py"} <= files
    assert checkout_files("tests") <= files
    assert {"tests/run_all.sh", "tests/start_services.sh", "testproject/run.sh"} <= files


def test_the_sdist_holds_the_docs_the_readme_the_sample_project_and_the_benchmarks(built):
    files = built.sdist_files()
    assert {"README.md", "LICENSE", "requirements-dev.txt", "setup.cfg", "pyproject.toml"} <= files
    assert checkout_files("docs") | checkout_files("testproject") | checkout_files("bench") <= files


def test_the_sdist_holds_no_caches_databases_or_test_artefacts(built):
    unwanted = [
        name
        for name in built.sdist_files()
        if "__pycache__" in name
        or name.endswith((".pyc", ".sqlite3"))
        or name.startswith(("tests/artifacts/", "bench/results/"))
    ]
    assert unwanted == []


def test_the_test_suite_is_collected_from_the_unpacked_sdist(built, tmp_path):
    with tarfile.open(built.sdist) as archive:
        archive.extractall(tmp_path, filter="data")
    [unpacked] = tmp_path.iterdir()
    environment = {
        **os.environ,
        "PYTHONPATH": str(unpacked),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "SCHEDULER_TEST_DB": "sqlite",
    }
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "tests"],
        cwd=unpacked,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )
    assert collected.returncode == 0, collected.stdout[-3000:]
    assert "tests/system/test_processes.py::" in collected.stdout
    assert "tests/test_packaging.py::" in collected.stdout


def test_the_wheel_holds_the_package_with_its_templates_and_nothing_else(built):
    files = built.wheel_files()
    templates = {name for name in checkout_files("scheduler_app/templates") if name.endswith(".html")}
    assert templates and templates <= files
    assert {"scheduler_app/py.typed", "scheduler_app/handlers/js_child.py"} <= files
    assert [name for name in files if not name.startswith(("scheduler_app/", "django_scheduler_app-"))] == []
    assert [name for name in files if "__pycache__" in name] == []


def test_the_metadata_names_the_license_the_project_urls_and_the_author(built):
    metadata = built.metadata()
    assert metadata["License"] == "BSD-3-Clause"
    classifiers = metadata.get_all("Classifier")
    assert "License :: OSI Approved :: BSD License" in classifiers
    assert "Development Status :: 4 - Beta" in classifiers
    assert metadata["Author"] == "the scheduler_app authors"
    assert metadata["Keywords"]
    assert sorted(metadata.get_all("Project-URL")) == [
        f"Documentation, {REPOSITORY}/tree/main/docs",
        f"Homepage, {REPOSITORY}",
        f"Issues, {REPOSITORY}/issues",
        f"Source, {REPOSITORY}",
    ]


def test_mini_racer_is_required_only_by_the_js_extra_and_the_extras_are_all_for_users(built):
    metadata = built.metadata()
    assert sorted(metadata.get_all("Provides-Extra")) == [
        "js",
        "metrics",
        "mysql",
        "openapi",
        "postgres",
        "redis",
        "tasks",
    ]
    requirements = [Requirement(line) for line in metadata.get_all("Requires-Dist")]
    mini_racer = [requirement for requirement in requirements if requirement.name == "mini-racer"]
    assert [str(requirement.marker) for requirement in mini_racer] == ['extra == "js"']
    unconditional = {requirement.name for requirement in requirements if requirement.marker is None}
    assert unconditional == {"Django", "djangorestframework", "requests", "urllib3", "tzdata"}


def test_the_build_finds_every_package_it_ships_data_for(built):
    # setuptools warns "Package '...' is absent from the `packages` configuration" for folders
    # of package data that package discovery does not list.
    assert "absent from" not in built.output


def matrix_of_the_noxfile() -> tuple[tuple[str, ...], dict[str, str]]:
    """The Pythons and the Djangos (version -> requirement) noxfile.py tests, read from its PYTHONS and DJANGO."""
    values = {}
    for node in ast.parse((ROOT / "noxfile.py").read_text()).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id in ("PYTHONS", "DJANGO"):
            values[target.id] = ast.literal_eval(node.value)
    return values["PYTHONS"], values["DJANGO"]


def test_the_classifiers_name_exactly_the_pythons_and_djangos_the_matrix_tests(built):
    pythons, djangos = map(set, matrix_of_the_noxfile())
    classifiers = built.metadata().get_all("Classifier")
    assert {
        c.rsplit(" :: ", 1)[1] for c in classifiers if c.startswith("Programming Language :: Python :: 3.")
    } == pythons
    assert {c.rsplit(" :: ", 1)[1] for c in classifiers if c.startswith("Framework :: Django :: ")} == djangos


def test_the_ci_runs_the_whole_suite_on_the_newest_combination_of_the_noxfile():
    pythons, djangos = matrix_of_the_noxfile()
    script = (ROOT / "tests" / "run_all.sh").read_text()
    newest_django = list(djangos)[-1]
    assert f"NEWEST_PYTHON={max(pythons)}\n" in script
    assert f'NEWEST_DJANGO="{djangos[newest_django]}"\n' in script
