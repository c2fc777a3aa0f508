#!/usr/bin/env bash
# Install everything, migrate the SQLite database, create an admin user (admin/admin)
# and start the admin on http://127.0.0.1:8000/admin/ beside the scheduler.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -e ".[redis]"
cd testproject
../.venv/bin/python manage.py migrate --noinput
DJANGO_SUPERUSER_PASSWORD=admin ../.venv/bin/python manage.py createsuperuser \
    --noinput --username admin --email admin@example.com 2>/dev/null || true
../.venv/bin/python manage.py runserver 127.0.0.1:8000 &
server=$!
trap 'kill $server 2>/dev/null' EXIT
../.venv/bin/python manage.py run_scheduler -v 2
