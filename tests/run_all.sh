#!/usr/bin/env bash
# Install everything, start the databases if they are down, run the suite on
# SQLite, PostgreSQL and MariaDB, then the migration check, ruff and mypy.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
VENV=.venv/bin

if ! dpkg -s libmariadb-dev >/dev/null 2>&1 || ! command -v pkg-config >/dev/null; then
    apt-get update -qq && apt-get install -y -qq libmariadb-dev pkg-config >/dev/null
fi
# libfaketime shifts one runner's clock in the skew tests (tests/system/test_outages.py).
if ! dpkg -s faketime >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq faketime >/dev/null
fi
# The package with every user extra, and the tools of the suite.
"$VENV/pip" install -q --disable-pip-version-check -r requirements-dev.txt

# -- browser tests (tests/test_admin_browser.py): Debian's Chromium and Playwright for Python.
# Playwright (from requirements-dev.txt) drives /usr/bin/chromium; it never downloads a browser of its own.
if [ ! -x /usr/bin/chromium ]; then
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
fi
# -- end of browser tests

bash tests/start_services.sh

export PYTHONPATH=$PWD
export DJANGO_SETTINGS_MODULE=tests.settings
status=0
for backend in sqlite postgres mysql; do
    echo "== pytest on $backend"
    SCHEDULER_TEST_DB=$backend "$VENV/python" -m pytest -q "$@" || status=1
done

echo "== makemigrations --check"
"$VENV/python" -m django makemigrations --check --dry-run || status=1
echo "== ruff"
"$VENV/ruff" check . && "$VENV/ruff" format --check . || status=1
echo "== mypy"
"$VENV/mypy" || status=1
exit $status
