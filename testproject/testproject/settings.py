"""A runnable project for trying scheduler_app: SQLite by default, PostgreSQL/MySQL/Redis by environment.

SCHEDULER_DEMO_DB=/path/demo.sqlite3   the SQLite file (default testproject/db.sqlite3)
SCHEDULER_DB=postgres  DATABASE_HOST, DATABASE_NAME, DATABASE_USER, DATABASE_PASSWORD
SCHEDULER_DB=mysql     the same variables
REDIS_URL=redis://127.0.0.1:6379/0   optional wake-ups
"""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "testproject-only-not-for-production")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "scheduler_app",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
ROOT_URLCONF = "testproject.urls"
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
STATIC_URL = "static/"

ENGINE = os.environ.get("SCHEDULER_DB", "sqlite")
if ENGINE in ("postgres", "mysql"):
    DATABASES = {
        "default": {
            "ENGINE": f"django.db.backends.{'postgresql' if ENGINE == 'postgres' else 'mysql'}",
            "NAME": os.environ.get("DATABASE_NAME", "scheduler"),
            "USER": os.environ.get("DATABASE_USER", "postgres" if ENGINE == "postgres" else "root"),
            "PASSWORD": os.environ.get("DATABASE_PASSWORD", ""),
            "HOST": os.environ.get("DATABASE_HOST", "127.0.0.1"),
            "CONN_MAX_AGE": None,
        }
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("SCHEDULER_DEMO_DB") or BASE_DIR / "db.sqlite3",
            # Each transaction takes the write lock when it begins: in the default (deferred) mode a
            # claim that read before writing fails at once with "database is locked" when another
            # runner, the admin or a trigger holds the lock. A transaction waits up to 20 s for the lock
            # (Django's default is 5). See docs/operations.md, SQLite.
            "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20},
        }
    }

SCHEDULER_APP = {
    "WORKERS": 4,
    # Short leases, so that a killed runner's attempts are recovered within half a minute (default 300 s).
    "LEASE_SECONDS": 30,
    "REDIS_URL": os.environ.get("REDIS_URL") or None,
    "HOOKS": {
        "on_task_execute": "testproject.hooks.on_task_execute",
        "on_task_finish": "testproject.hooks.on_task_finish",
        "on_task_interrupted": "testproject.hooks.on_task_interrupted",
    },
    "TASKS": [
        {
            "id": "heartbeat",
            "name": "Heartbeat every minute",
            "cron": "* * * * *",
            "params": {"message": "still here"},
        },
        {
            "id": "nightly-report",
            "name": "Nightly report",
            "cron": "0 2 * * *",
            "timezone": "Europe/Berlin",
            "retry": {"max_attempts": 3, "backoff": [10, 60]},
            "idempotent": True,
            "params": {"channel": "ops"},
        },
        {
            "id": "flaky",
            "name": "Fails every other minute, then retries",
            "cron": "*/2 * * * *",
            "retry": {"max_attempts": 2, "backoff": [5]},
            "params": {"fail_on_first_attempt": True},
        },
        {
            "id": "slow",
            "name": "Takes 20 seconds: run it now, kill the runner meanwhile, watch it recover",
            "cron": "0 4 * * *",
            # An attempt lost with its runner is run again (a second attempt), not left unknown.
            "idempotent": True,
            "retry": {"max_attempts": 2, "backoff": [5]},
            "params": {"seconds": 20},
        },
    ],
}

# The runner's lines and the sample hooks' lines (logger "testproject"), with time and origin.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"demo": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "demo"}},
    "loggers": {
        "scheduler_app": {"handlers": ["console"], "level": "INFO"},
        "testproject": {"handlers": ["console"], "level": "INFO"},
    },
}
