"""Django settings of the django-q2 side of bench/peers/run.py: its ORM broker on the benchmark's PostgreSQL.

Everything else is django-q2's default but the number of workers: 16 per cluster, so that
two clusters run 32 tasks at once, the max concurrency of W2.
"""

import os

SECRET_KEY = "bench-only-not-secret"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django_q"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ["BENCH_DB_NAME"],
        "USER": "postgres",
        "HOST": os.environ.get("PGHOST", "127.0.0.1"),
        "PORT": os.environ["PGPORT"],
    }
}
# "orm": the database is the broker (the default broker is Redis).
Q_CLUSTER = {"name": "bench", "orm": "default", "workers": 16}
