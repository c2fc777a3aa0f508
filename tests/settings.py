"""Settings for the test suite; SCHEDULER_TEST_DB picks sqlite (default), postgres or mysql."""

import os
import tempfile
from typing import Any

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
    "rest_framework",
    "scheduler_app",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
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
DB_NAME = os.environ.get("SCHEDULER_DB_NAME")

if BACKEND == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": DB_NAME or "scheduler",
            "USER": os.environ.get("PGUSER", "postgres"),
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            "TEST": {"NAME": DB_NAME or "test_scheduler"},
        }
    }
elif BACKEND == "mysql":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": DB_NAME or "scheduler",
            "USER": "root",
            "PASSWORD": "",
            "HOST": os.environ.get("MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("MYSQL_PORT", "3306"),
            "OPTIONS": {"charset": "utf8mb4"},
            "TEST": {"NAME": DB_NAME or "test_scheduler", "CHARSET": "utf8mb4"},
        }
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": DB_NAME or os.path.join(os.path.dirname(__file__), "scheduler-test.sqlite3"),
            "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20},
            # A file, not memory: threaded tests need real concurrent connections.
            "TEST": {"NAME": DB_NAME or os.path.join(tempfile.gettempdir(), "scheduler-test.sqlite3")},
        }
    }

# A second alias, so that LOG_DATABASE can be tested on a database of its own.
_logs: dict[str, Any] = dict(DATABASES["default"])
if BACKEND == "sqlite":
    _logs["NAME"] = os.path.join(tempfile.gettempdir(), "scheduler-logs.sqlite3")
    _logs["TEST"] = {"NAME": os.path.join(tempfile.gettempdir(), "scheduler-test-logs.sqlite3")}
else:
    _logs["NAME"] = "scheduler_logs"
    _logs["TEST"] = {**_logs["TEST"], "NAME": "test_scheduler_logs"}
DATABASES["logs"] = _logs

SCHEDULER_APP: dict[str, object] = {
    "HOOKS": {"on_task_execute": "tests.hooks.on_task_execute"},
    "HANDLERS": {"fake": "scheduler_app.handlers.fake.FakeHandler"},
    "REDIS_URL": os.environ.get("SCHEDULER_REDIS_URL") or None,
}
if os.environ.get("SCHEDULER_LEASE"):
    SCHEDULER_APP["LEASE_SECONDS"] = float(os.environ["SCHEDULER_LEASE"])

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "scheduler_app": {"handlers": ["console"], "level": os.environ.get("SCHEDULER_LOG_LEVEL", "WARNING")}
    },
}
