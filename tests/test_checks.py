"""System checks over SCHEDULER_APP: one test per check id, and the table in docs/operations.md."""

from __future__ import annotations

import ast
import logging
import re
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.checks import CheckMessage
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings
from rest_framework.permissions import IsAdminUser, IsAuthenticated

from scheduler_app.checks import CHECKS, check_javascript_settings, check_javascript_tasks, check_settings
from scheduler_app.models import Task

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "operations.md"
CHECKS_SOURCE = ROOT / "scheduler_app" / "checks.py"

# One row per way to trigger an id; every id has at least one.
TRIGGERS = [
    ("scheduler_app.E001", ["WORKERS", 0]),
    ("scheduler_app.E002", {"TASKS": [{"id": "a", "cron": "99 * * * *"}]}),
    ("scheduler_app.E002", {"TASKS": "nightly"}),
    ("scheduler_app.E003", {"HANDLERS": {"custom": "tests.nowhere.Handler"}}),
    ("scheduler_app.E003", {"HANDLERS": {"custom": 42}}),
    ("scheduler_app.E004", {"LOG_DATABASE": "elsewhere"}),
    ("scheduler_app.E005", {"SURPRISE": 1}),
    ("scheduler_app.E006", {"TICK_INTERVAL": 0}),
    ("scheduler_app.E007", {"LEASE_SECONDS": "300"}),
    ("scheduler_app.E008", {"WORKERS": 0}),
    ("scheduler_app.E008", {"WORKERS": 2.5}),
    ("scheduler_app.E008", {"WORKERS": "4"}),
    ("scheduler_app.E009", {"MISFIRE_GRACE_SECONDS": 0}),
    ("scheduler_app.E010", {"DRAIN_SECONDS": -1}),
    ("scheduler_app.E011", {"MAX_LOGS": 0}),
    ("scheduler_app.E012", {"RETENTION_DAYS": "7"}),
    ("scheduler_app.E013", {"HTTP": "strict"}),
    ("scheduler_app.E014", {"HTTP": {"PROXY": "http://proxy.example"}}),
    ("scheduler_app.E015", {"HTTP": {"TIMEOUT": 0}}),
    ("scheduler_app.E015", {"HTTP": {"TIMEOUT": 3601}}),
    ("scheduler_app.E016", {"HTTP": {"MAX_RESPONSE_BYTES": 1.5}}),
    ("scheduler_app.E017", {"HTTP": {"RESULT_MAX_BYTES": "64k"}}),
    ("scheduler_app.E018", {"HTTP": {"ALLOW_PRIVATE_NETWORKS": "yes"}}),
    ("scheduler_app.E019", {"HTTP": {"ALLOWED_NETWORKS": "10.0.0.0/8"}}),
    ("scheduler_app.E020", {"HTTP": {"ALLOWED_NETWORKS": ["10.0.0.0/33"]}}),
    ("scheduler_app.E020", {"HTTP": {"ALLOWED_NETWORKS": ["not a host"]}}),
    ("scheduler_app.E021", {"JS": "fast"}),
    ("scheduler_app.E022", {"JS": {"THREADS": 2}}),
    ("scheduler_app.E023", {"JS": {"TIMEOUT": 0}}),
    ("scheduler_app.E024", {"JS": {"MEMORY_LIMIT_MB": "lots"}}),
    ("scheduler_app.E025", {"JS": {"RESULT_MAX_BYTES": 0}}),
    ("scheduler_app.E026", {"HOOKS": ["not", "a", "dict"]}),
    ("scheduler_app.E027", {"HOOKS": {"on_task_explode": "tests.hooks.on_task_execute"}}),
    ("scheduler_app.E028", {"HOOKS": {"on_task_execute": "tests.nowhere.hook"}}),
    ("scheduler_app.E029", {"HANDLERS": ["tests.nowhere.Handler"]}),
    ("scheduler_app.E030", {"API_PERMISSION_CLASSES": "rest_framework.permissions.IsAuthenticated"}),
    ("scheduler_app.E031", {"API_PERMISSION_CLASSES": ["tests.nowhere.Permission"]}),
    ("scheduler_app.E031", {"API_PERMISSION_CLASSES": ["django.utils.timezone.now"]}),
    ("scheduler_app.W001", {"REDIS_URL": "http://localhost:6379"}),
    ("scheduler_app.E033", {"TICK_INTERVAL": 100, "LEASE_SECONDS": 300}),
    ("scheduler_app.E033", {"TICK_INTERVAL": 2, "LEASE_SECONDS": 5}),
    ("scheduler_app.W002", {"TICK_INTERVAL": 60, "LEASE_SECONDS": 300}),
    ("scheduler_app.E035", {"HOOK_TIMEOUT": 0}),
    ("scheduler_app.E036", {"FUNCTIONS": ["tests.jobapp.jobs.echo"]}),
    ("scheduler_app.E037", {"FUNCTIONS": {"gone": "tests.nowhere.function"}}),
    # tests.jobapp.jobs registers a different function as "echo" with @job.
    ("scheduler_app.E038", {"FUNCTIONS": {"echo": "tests.hooks.on_task_execute"}}),
    ("scheduler_app.E041", {"TASK_MODULES": "tests.outside_tasks"}),
    ("scheduler_app.E041", {"TASK_MODULES": [""]}),
    ("scheduler_app.E042", {"TASK_MODULES": ["tests.nowhere"]}),
    ("scheduler_app.E043", {"PREPARED_STATEMENTS": "auto"}),
    ("scheduler_app.E044", {"JOURNAL_RETENTION_DAYS": 0}),
    ("scheduler_app.E044", {"JOURNAL_RETENTION_DAYS": 1.5}),
    ("scheduler_app.E045", {"JOURNAL_RETENTION_DAYS": 1, "MISFIRE_GRACE_SECONDS": 86400}),
    ("scheduler_app.E046", {"ALERTS": ["unknown"]}),
    ("scheduler_app.E047", {"ALERTS": {"MAIL": ["unknown"]}}),
    ("scheduler_app.E048", {"ALERTS": {"MAIL_ADMINS": ["retried"]}}),
    ("scheduler_app.E048", {"ALERTS": {"MAIL_ADMINS": "unknown"}}),
    ("scheduler_app.E049", {"ALERTS": {"EVERY_SECONDS": 0}}),
    ("scheduler_app.E050", {"ALERTS": {"BASE_URL": "ops.example.com"}}),
]
# Conditions of Django's own settings: (id, SCHEDULER_APP, the Django settings that trigger it).
DJANGO_TRIGGERS = [
    ("scheduler_app.E032", {}, {"USE_TZ": False}),
    (
        "scheduler_app.W003",
        {},
        {"DATABASES": {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "x.sqlite3"}}},
    ),
    (
        "scheduler_app.W003",
        {"LOG_DATABASE": "logs"},
        {
            "DATABASES": {
                "default": {"ENGINE": "django.db.backends.postgresql", "NAME": "app"},
                "logs": {
                    "ENGINE": "django.db.backends.sqlite3",
                    "NAME": "logs.sqlite3",
                    "OPTIONS": {"transaction_mode": "DEFERRED"},
                },
            }
        },
    ),
]


def messages(value=None, /, **settings) -> list[CheckMessage]:
    """The messages of the checks with SCHEDULER_APP set to ``value``, or else to ``settings``."""
    with override_settings(SCHEDULER_APP=settings if value is None else value):
        return check_settings()


def documented() -> dict[str, tuple[str, str, str]]:
    """The rows of the system checks table in docs/operations.md: id -> (level, message, hint)."""
    section = DOCS.read_text().split("## System checks\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        found = re.fullmatch(r"\| `(scheduler_app\.[EW]\d{3})` \| (\w+) \| `(.+)` \| (.+) \|", line)
        if found:
            check_id, level, message, hint = found.groups()
            assert check_id not in rows, f"{check_id} is documented twice"
            rows[check_id] = (level, message, hint)
    return rows


def as_pattern(documented_message: str) -> str:
    """A regular expression for the messages a documented one stands for (``<...>`` is what was found)."""
    return ".+".join(re.escape(part) for part in re.split(r"<\w+>", documented_message))


@pytest.mark.parametrize(("check_id", "settings"), TRIGGERS)
def test_each_condition_is_reported_under_its_id_with_the_documented_message_and_hint(check_id, settings):
    level, documented_message, documented_hint = documented()[check_id]
    [message] = messages(settings)
    assert message.id == check_id
    assert re.fullmatch(as_pattern(documented_message), message.msg)
    assert message.hint
    assert message.hint == documented_hint
    assert type(message).__name__ == level


# The checks read settings.DATABASES only; no connection is made from the overridden one.
@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES:UserWarning")
@pytest.mark.parametrize(("check_id", "settings", "django_settings"), DJANGO_TRIGGERS)
def test_each_condition_of_django_settings_is_reported_with_the_documented_message(
    check_id, settings, django_settings
):
    level, documented_message, documented_hint = documented()[check_id]
    with override_settings(**django_settings):
        [message] = messages(settings)
    assert message.id == check_id
    assert re.fullmatch(as_pattern(documented_message), message.msg)
    assert message.hint == documented_hint
    assert type(message).__name__ == level


def test_every_id_has_a_trigger_above():
    triggered = {check_id for check_id, _ in TRIGGERS} | {check_id for check_id, *_ in DJANGO_TRIGGERS}
    assert triggered | set(WITHOUT_V8) | set(DECLARATIONS) == set(CHECKS)


def test_the_ids_in_checks_py_and_in_the_docs_table_are_the_same():
    used = set(re.findall(r"scheduler_app\.[EW]\d{3}", CHECKS_SOURCE.read_text()))
    assert used == set(CHECKS)
    assert set(documented()) == used


def test_the_docs_table_shows_each_message_and_hint_as_checks_py_has_them():
    for check_id, check in CHECKS.items():
        shown = re.sub(r"\{(\w+)[^}]*\}", r"<\1>", check.message)
        assert documented()[check_id] == (check.level.__name__, shown, check.hint)


def test_the_defaults_pass():
    assert messages() == []


def test_the_test_settings_pass():
    assert check_settings() == []


def test_a_problem_message_names_what_was_found():
    [message] = messages(JS={"THREADS": 2, "TIMEOUT": 30})
    assert message.msg == "Unknown SCHEDULER_APP['JS'] keys: THREADS."
    [message] = messages(HANDLERS={"custom": "tests.nowhere.Handler"})
    assert message.msg == (
        "SCHEDULER_APP['HANDLERS']['custom'] cannot be imported: 'tests.nowhere.Handler'"
        " (ModuleNotFoundError: No module named 'tests.nowhere')."
    )


def test_an_import_error_inside_the_hooks_own_module_is_shown(tmp_path, monkeypatch):
    (tmp_path / "broken_hooks.py").write_text("import not_installed_dependency\n")
    (tmp_path / "failing_hooks.py").write_text("raise RuntimeError('SETTINGS_X is missing')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    [broken] = messages(HOOKS={"on_task_execute": "broken_hooks.run"})
    assert broken.id == "scheduler_app.E028"
    assert "(ModuleNotFoundError: No module named 'not_installed_dependency')" in broken.msg
    [failing] = messages(HOOKS={"on_task_execute": "failing_hooks.run"})
    assert failing.id == "scheduler_app.E028"
    assert "(RuntimeError: SETTINGS_X is missing)" in failing.msg


def test_a_missing_attribute_of_an_existing_module_is_named():
    [message] = messages(HOOKS={"on_task_execute": "tests.hooks.no_such_hook"})
    assert 'does not define a "no_such_hook" attribute' in message.msg


@pytest.mark.parametrize(
    "settings",
    [
        {"HTTP": {"ALLOWED_NETWORKS": ["10.1.0.0/16", "fd00::/8", "127.0.0.1", "billing.internal"]}},
        {"JS": {"TIMEOUT": 3600, "MEMORY_LIMIT_MB": 256, "RESULT_MAX_BYTES": 1}},
        {
            "WORKERS": 1,
            "TICK_INTERVAL": 0.05,
            "MISFIRE_GRACE_SECONDS": 1.5,
            "MAX_LOGS": 10,
            "RETENTION_DAYS": 1,
        },
        {
            "HOOKS": {"on_task_execute": print},
            "HANDLERS": {"custom": "scheduler_app.handlers.fake.FakeHandler"},
        },
        {"API_PERMISSION_CLASSES": None},
        {"API_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"]},
        {"API_PERMISSION_CLASSES": ("scheduler_app.api.permissions.HasModelPermissions", IsAdminUser)},
        {"API_PERMISSION_CLASSES": [IsAuthenticated & IsAdminUser]},
        {"REDIS_URL": "rediss://cache.internal:6380/1"},
    ],
)
def test_valid_values_pass(settings):
    assert messages(**settings) == []


def test_handlers_set_under_override_settings_take_effect_and_are_undone_after():
    from scheduler_app.handlers import registry
    from scheduler_app.handlers.fake import FakeHandler

    assert registry.get("custom") is None
    with override_settings(SCHEDULER_APP={"HANDLERS": {"custom": "scheduler_app.handlers.fake.FakeHandler"}}):
        assert isinstance(registry.get("custom"), FakeHandler)
    assert registry.get("custom") is None


def test_conf_imports_nothing_from_the_app():
    tree = ast.parse((ROOT / "scheduler_app" / "conf.py").read_text())
    imported = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imported += [
        alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    ]
    assert not [name for name in imported if name.startswith("scheduler_app")]


# -- a node without mini-racer (the js extra) --------------------------------

# Conditions of this node's Python rather than of the settings alone, each tested below.
WITHOUT_V8 = ("scheduler_app.W005", "scheduler_app.W004")
# Need @job declarations or tasks in the database: tested in tests/test_declared_tasks.py.
DECLARATIONS = ("scheduler_app.E039", "scheduler_app.E040")
JS_TASK = {"id": "invoice-summary", "cron": "0 6 * * *", "handler": {"kind": "js", "code": "() => 1"}}


@pytest.fixture
def without_v8(monkeypatch):
    """This Python as installed without the js extra: py_mini_racer cannot be imported."""
    monkeypatch.setitem(sys.modules, "py_mini_racer", None)


def assert_documented(message: CheckMessage, check_id: str) -> None:
    level, documented_message, documented_hint = documented()[check_id]
    assert message.id == check_id
    assert re.fullmatch(as_pattern(documented_message), message.msg)
    assert message.hint == documented_hint
    assert type(message).__name__ == level


def js_tasks_in_the_database() -> None:
    Task.objects.create(id="invoice-summary", cron="0 6 * * *", handler=JS_TASK["handler"])
    Task.objects.create(id="paused", cron="0 6 * * *", handler=JS_TASK["handler"], enabled=False)
    Task.objects.create(id="ping", cron="* * * * *", handler={"kind": "fake"})


def test_js_tasks_declared_in_tasks_without_mini_racer_are_warning_w005(without_v8):
    api_task = {"id": "ping", "cron": "* * * * *", "handler": {"kind": "api", "url": "https://example.com/"}}
    with override_settings(SCHEDULER_APP={"TASKS": [JS_TASK, api_task]}):
        [message] = check_javascript_settings()
        assert check_settings() == []
    assert_documented(message, "scheduler_app.W005")
    assert message.msg.startswith("SCHEDULER_APP['TASKS'] declares js tasks (invoice-summary), but ")


def test_js_tasks_declared_in_tasks_pass_with_mini_racer_installed():
    with override_settings(SCHEDULER_APP={"TASKS": [JS_TASK]}):
        assert check_javascript_settings() == []


@pytest.mark.django_db
def test_enabled_js_tasks_in_the_database_without_mini_racer_are_warning_w004_found_in_one_query(
    without_v8, django_assert_num_queries
):
    js_tasks_in_the_database()
    with django_assert_num_queries(1):
        [message] = check_javascript_tasks(databases=["default"])
    assert_documented(message, "scheduler_app.W004")
    assert "(invoice-summary)" in message.msg
    assert check_javascript_tasks(databases=None) == []


@pytest.mark.django_db
def test_w004_costs_no_query_with_mini_racer_installed(django_assert_num_queries):
    js_tasks_in_the_database()
    with django_assert_num_queries(0):
        assert check_javascript_tasks(databases=["default"]) == []


# Django 6.1's check command gives the model checks every alias (logs too) when none is named.
@pytest.mark.django_db(databases=["default", "logs"])
def test_w004_is_reported_by_manage_py_check_with_database_only(without_v8):
    js_tasks_in_the_database()
    with_database, without_database = StringIO(), StringIO()
    call_command("check", "--database", "default", stdout=StringIO(), stderr=with_database)
    call_command("check", stdout=StringIO(), stderr=without_database)
    assert "scheduler_app.W004" in with_database.getvalue()
    assert "scheduler_app.W004" not in without_database.getvalue()


@pytest.mark.django_db(transaction=True)
def test_run_scheduler_logs_w004_at_start(without_v8, caplog):
    js_tasks_in_the_database()
    with caplog.at_level(logging.WARNING, logger="scheduler_app"):
        call_command("run_scheduler", "--once", "--verbosity", "0")
    [logged] = [record.getMessage() for record in caplog.records if "W004" in record.getMessage()]
    assert logged.startswith("scheduler_app.W004: The database holds enabled js tasks (invoice-summary)")


@pytest.mark.django_db(transaction=True)
def test_run_scheduler_runs_the_apps_checks_at_start_and_leaves_the_web_sides_to_manage_py_check():
    with (
        override_settings(SCHEDULER_APP={"NOPE": 1}),
        pytest.raises(SystemCheckError, match=r"scheduler_app\.E005"),
    ):
        call_command("run_scheduler", "--once", "--verbosity", "0", skip_checks=False)
    # A URLconf that cannot be imported fails the URL checks; the runner serves no URL and starts.
    with override_settings(ROOT_URLCONF="tests.no_such_urlconf"):
        call_command("run_scheduler", "--once", "--verbosity", "0", skip_checks=False)
        with pytest.raises(ImportError):
            call_command("check", stdout=StringIO(), stderr=StringIO())
