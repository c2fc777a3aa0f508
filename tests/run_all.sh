#!/usr/bin/env bash
# Install everything, start the databases if they are down, run the whole suite on SQLite,
# PostgreSQL and MariaDB with the newest supported Python and Django, then the migration check,
# ruff and mypy. Beside it, at the lowest CPU priority, nox runs the suite without process tests
# on SQLite for every other supported Python x Django combination (noxfile.py).
set -euo pipefail
cd "$(dirname "$0")/.."

# The newest combination of noxfile.py's MATRIX (tests/test_packaging.py checks they agree).
NEWEST_PYTHON=3.13
NEWEST_DJANGO="Django>=6.1,<6.2"
# The other combinations' Redis: pub/sub channels are server-wide, so they get a server of their own.
NOX_REDIS_PORT=6380

python_version() {  # python_version X.Y: pyenv's newest X.Y.*, else pythonX.Y on PATH
    local found
    found=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$1".*/bin/python"$1" 2>/dev/null | sort -V | tail -1)
    echo "${found:-$(command -v "python$1" || true)}"
}
PYTHON=${PYTHON:-$(python_version "$NEWEST_PYTHON")}
if [ -z "$PYTHON" ]; then
    echo "Python $NEWEST_PYTHON is needed (pyenv install $NEWEST_PYTHON, or set PYTHON)" >&2
    exit 1
fi
# A .venv of another Python (an older checkout's) is made anew.
version_of() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }
if [ -x .venv/bin/python ] && [ "$(version_of .venv/bin/python)" != "$(version_of "$PYTHON")" ]; then
    rm -rf .venv
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
VENV=.venv/bin

if ! dpkg -s libmariadb-dev >/dev/null 2>&1 || ! command -v pkg-config >/dev/null; then
    apt-get update -qq && apt-get install -y -qq libmariadb-dev pkg-config >/dev/null
fi
# libfaketime shifts one runner's clock in the skew tests (tests/system/test_outages.py).
if ! dpkg -s faketime >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq faketime >/dev/null
fi
# The package with every user extra, the tools of the suite, and nox for the matrix.
"$VENV/pip" install -q --disable-pip-version-check -r requirements-dev.txt "$NEWEST_DJANGO"

# -- browser tests (tests/test_admin_browser.py): Debian's Chromium and Playwright for Python.
# Playwright (from requirements-dev.txt) drives /usr/bin/chromium; it never downloads a browser of its own.
if [ ! -x /usr/bin/chromium ]; then
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
fi
# -- end of browser tests

bash tests/start_services.sh

# The other combinations, at the lowest CPU and disk priority so that the timing of the process
# tests is not disturbed: they mostly wait (for leases, minute boundaries, other processes), which
# leaves the CPU to nox. Its own process group, ended with this script whatever way it ends.
if ! redis-cli -p "$NOX_REDIS_PORT" ping >/dev/null 2>&1; then
    redis-server --daemonize yes --bind 127.0.0.1 --port "$NOX_REDIS_PORT" --save "" --appendonly no \
        --dir /tmp --logfile /tmp/redis-nox.log
fi
mkdir -p tests/artifacts
SCHEDULER_TEST_REDIS_PORT=$NOX_REDIS_PORT setsid nice -n 19 ionice -c 3 "$VENV/nox" -t older \
    >tests/artifacts/nox.log 2>&1 &
NOX_PID=$!
trap 'kill -- -"$NOX_PID" 2>/dev/null || true' EXIT

export PYTHONPATH=$PWD
export DJANGO_SETTINGS_MODULE=tests.settings
status=0
"$VENV/python" -m django --version | sed 's/^/== Django /'
for backend in sqlite postgres mysql; do
    echo "== pytest on $backend (Python $NEWEST_PYTHON)"
    SCHEDULER_TEST_DB=$backend "$VENV/python" -m pytest -q "$@" || status=1
done

echo "== makemigrations --check"
"$VENV/python" -m django makemigrations --check --dry-run || status=1
echo "== ruff"
"$VENV/ruff" check . && "$VENV/ruff" format --check . || status=1
echo "== mypy"
"$VENV/mypy" || status=1

echo "== the other supported combinations (nox -t older; log: tests/artifacts/nox.log)"
if wait "$NOX_PID"; then
    grep -E "^nox > (Session|Ran)|^[0-9]+ passed" tests/artifacts/nox.log || true
else
    # Each failed test's traceback and the short summaries (FAILED/ERROR lines), then the sessions.
    awk '/^=+ (FAILURES|ERRORS) =+$/ {show = 1} /^=+ (short test summary info|warnings summary) =+$/ {show = 0}
         /^(FAILED|ERROR) / || /^nox > Running session/ || show' tests/artifacts/nox.log | head -n 400 || true
    grep -E "^nox > (Session|Ran)" tests/artifacts/nox.log || true
    status=1
fi
exit $status
