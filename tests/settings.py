"""Settings for the test suite; SCHEDULER_TEST_DB picks sqlite (default), postgres or mysql."""

import importlib.util
import os
import tempfile
from typing import Any

import django

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "scheduler_app",
    # Its jobs module registers @job functions, found by autodiscovery.
    "tests.jobapp",
]
if importlib.util.find_spec("django_tasks_db"):
    # The database backend of Django's tasks: its tables, for the db_worker tests (tests/system).
    INSTALLED_APPS.append("django_tasks_db")
if os.environ.get("SCHEDULER_TASKS_BACKEND") == "database":
    # Processes of the db_worker tests: runners enqueue in the database, a db_worker process runs them.
    TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}}
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
# The live server of the browser tests serves the admin's static files from here.
STATIC_URL = "/static/"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

BACKEND = os.environ.get("SCHEDULER_TEST_DB", "sqlite")
# Runner processes started by the tests connect straight to the test database.
DB_NAME = os.environ.get("SCHEDULER_DB_NAME")
# Distinct names let several suites share one server without clobbering each other.
TEST_NAME = DB_NAME or os.environ.get("SCHEDULER_TEST_DB_NAME", "test_scheduler")


def database(name: str) -> dict[str, Any]:
    """Settings of one database called ``name`` on the chosen backend (used as-is: it is the test database)."""
    if BACKEND == "postgres":
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": os.environ.get("PGUSER", "postgres"),
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            "TEST": {"NAME": name},
        }
    if BACKEND == "mysql":
        return {
            "ENGINE": "django.db.backends.mysql",
            "NAME": name,
            "USER": "root",
            "PASSWORD": "",
            "HOST": os.environ.get("MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("MYSQL_PORT", "3306"),
            "OPTIONS": {"charset": "utf8mb4"},
            "TEST": {"NAME": name, "CHARSET": "utf8mb4"},
        }
    path = name if os.path.isabs(name) else os.path.join(tempfile.gettempdir(), f"{name}.sqlite3")
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": path,
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20},
        # A file, not memory: threaded tests need real concurrent connections.
        "TEST": {"NAME": path},
    }


DATABASES = {
    "default": database(TEST_NAME),
    # A second alias, so that LOG_DATABASE can be tested on a database of its own.
    "logs": database(f"{TEST_NAME}_logs"),
}

SCHEDULER_APP: dict[str, object] = {
    "HOOKS": {"on_task_execute": "tests.hooks.on_task_execute"},
    "HANDLERS": {"fake": "scheduler_app.handlers.fake.FakeHandler"},
    "REDIS_URL": os.environ.get("SCHEDULER_REDIS_URL") or None,
}
if os.environ.get("SCHEDULER_LEASE"):
    lease = float(os.environ["SCHEDULER_LEASE"])
    # Short test leases keep the tick well below a third of them (checks E033, W002).
    SCHEDULER_APP.update(LEASE_SECONDS=lease, TICK_INTERVAL=min(1.0, lease / 10))
if os.environ.get("SCHEDULER_HOOK_TIMEOUT"):
    # Runner processes of the time-limit tests: hooks cancelled (and abandoned) within seconds.
    SCHEDULER_APP["HOOK_TIMEOUT"] = float(os.environ["SCHEDULER_HOOK_TIMEOUT"])

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "scheduler_app": {"handlers": ["console"], "level": os.environ.get("SCHEDULER_LOG_LEVEL", "WARNING")}
    },
}

# Django 6.1 asks for MAILERS (EMAIL_BACKEND goes in 7.0); tests send through the memory backend anyway.
if django.VERSION >= (6, 1):
    MAILERS = {"default": {"BACKEND": "django.core.mail.backends.locmem.EmailBackend"}}
