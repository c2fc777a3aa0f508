#!/usr/bin/env bash
# Try scheduler_app: a SQLite database with the sample tasks of testproject/testproject/settings.py,
# the admin on http://127.0.0.1:8000/admin/ (user admin, password admin) and one runner beside it.
#
#   bash testproject/run.sh                  start (the admin on port 8000)
#   PORT=8001 bash testproject/run.sh        the admin on another port
#   bash testproject/run.sh --mark-installed record a .venv installed by other means (such as
#                                            tests/run_all.sh) as current, so that run.sh does not
#                                            install into it; starts nothing
#
# Environment:
#   PORT                the admin's port (default 8000). When it is taken, run.sh stops before
#                       starting anything, with exit status 1.
#   SCHEDULER_DEMO_DB   the SQLite file (default testproject/db.sqlite3)
#   PYTHON              the Python that creates .venv (default python3)
#   FORCE_INSTALL=1     install even when .venv looks current
#
# Installing: the first start creates .venv and runs pip install -e ".[redis]", and says so. Later
# starts skip pip unless .venv lacks the app or its dependencies, or setup.cfg or pyproject.toml
# changed since: .venv/.run-sh-installed holds a hash of both files (and of the extras), written
# after each install.
#
# Crashes: the admin stays up when the runner dies. run.sh prints the runner's pid at each start
# and starts a new runner 2 s after one exits. To watch a recovery: in the admin, run the task
# "slow" (it takes 20 s), kill the runner meanwhile (kill -9 <pid>), then follow the execution's
# page: once the lease has expired (LEASE_SECONDS is 30 here) the new runner recovers it and, the
# task being idempotent with an attempt left, runs the same occurrence again as attempt 2 (a task
# without either would end unknown, for an operator to resolve). On the Runners page the killed
# runner turns silent.
#
# Ctrl-C (or SIGTERM to this script) stops both: the runner gets one SIGTERM, interrupts and drains
# its attempts and exits; the admin stops. The two run in process groups of their own, so Ctrl-C
# reaches only this script, which then signals each of them once.
set -euo pipefail
cd "$(dirname "$0")/.."

extras="redis"
stamp=.venv/.run-sh-installed
mark_only=""
case "${1:-}" in
    "") ;;
    --mark-installed) mark_only=1 ;;
    *)
        echo "usage: [PORT=8000] bash testproject/run.sh [--mark-installed]" >&2
        exit 2
        ;;
esac

venv_has_the_app() {
    # -I: not the checkout's own folder on sys.path, so this finds what is installed in .venv.
    .venv/bin/python -I -c "import django, redis, rest_framework, scheduler_app" 2>/dev/null
}

install_digest() {
    .venv/bin/python -I -c '
import hashlib, sys
digest = hashlib.sha256(sys.argv[1].encode())
for name in sys.argv[2:]:
    with open(name, "rb") as handle:
        digest.update(handle.read())
print(digest.hexdigest())
' "$extras" setup.cfg pyproject.toml
}

if [ -n "$mark_only" ]; then
    if [ ! -x .venv/bin/python ] || ! venv_has_the_app; then
        echo "run.sh: .venv lacks the app or its dependencies; start run.sh without --mark-installed to install them" >&2
        exit 1
    fi
    install_digest >"$stamp"
    echo "run.sh: recorded .venv as installed for the current setup.cfg and pyproject.toml"
    exit 0
fi

port="${PORT:-8000}"
case "$port" in
    "" | *[!0-9]*) port_ok="" ;;
    *) [ "$port" -ge 1 ] && [ "$port" -le 65535 ] && port_ok=1 || port_ok="" ;;
esac
if [ -z "$port_ok" ]; then
    echo "run.sh: PORT must be a port number from 1 to 65535, not '$port'" >&2
    exit 2
fi

# Before anything starts: a second demo on the same SQLite file would run a second runner beside
# the first and fail to start its admin.
python="${PYTHON:-python3}"
[ -x .venv/bin/python ] && python=.venv/bin/python
if ! "$python" -I -c '
import socket, sys
address = ("127.0.0.1", int(sys.argv[1]))
with socket.socket() as probe:
    probe.settimeout(1)
    if probe.connect_ex(address) == 0:
        sys.exit(1)  # something answers there
with socket.socket() as probe:
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as runserver binds
    try:
        probe.bind(address)
    except OSError:
        sys.exit(1)
' "$port"; then
    echo "run.sh: port $port on 127.0.0.1 is already in use (another run.sh or server?); nothing was started." >&2
    echo "run.sh: stop what uses it, or choose another port: PORT=8001 bash testproject/run.sh" >&2
    exit 1
fi

[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
if [ "${FORCE_INSTALL:-}" = 1 ] || ! venv_has_the_app || [ "$(cat "$stamp" 2>/dev/null)" != "$(install_digest)" ]; then
    echo "run.sh: installing the app and its dependencies into .venv (pip install -e \".[$extras]\")"
    .venv/bin/pip install -q --disable-pip-version-check -e ".[$extras]"
    install_digest >"$stamp"
fi

cd testproject
../.venv/bin/python manage.py migrate --noinput
DJANGO_SUPERUSER_PASSWORD=admin ../.venv/bin/python manage.py createsuperuser \
    --noinput --username admin --email admin@example.com >/dev/null 2>&1 || true

admin=""
runners=""
stop() {
    trap - INT TERM
    echo "run.sh: stopping the runner and the admin"
    [ -z "$runners" ] || kill -TERM "$runners" 2>/dev/null || true
    [ -z "$admin" ] || kill -TERM "$admin" 2>/dev/null || true
    wait || true
    exit 0
}
trap stop INT TERM

# The runner, started again whenever it exits, until this loop gets SIGTERM.
run_runners() {
    local runner="" stopping="" status why
    trap 'stopping=1; [ -z "$runner" ] || kill -TERM "$runner" 2>/dev/null || true' TERM
    while [ -z "$stopping" ]; do
        ../.venv/bin/python manage.py run_scheduler -v 2 &
        runner=$!
        echo "run.sh: runner started (pid $runner)"
        status=0
        wait "$runner" || status=$?
        if [ -n "$stopping" ]; then
            # The SIGTERM interrupted the wait, not the runner, which is draining: wait for it.
            status=0
            wait "$runner" 2>/dev/null || status=$?
            echo "run.sh: the runner stopped (exit status $status)"
            break
        fi
        runner=""
        if [ "$status" -gt 128 ]; then
            why="killed by signal $((status - 128))"
        else
            why="exit status $status"
        fi
        echo "run.sh: the runner stopped ($why); the admin stays up; a new runner starts in 2 s"
        sleep 2 &
        wait $! || true
    done
}

# set -m gives each background job a process group of its own, out of reach of the terminal's
# Ctrl-C: only this script gets it, and stop() signals each job once.
set -m
../.venv/bin/python manage.py runserver --noreload "127.0.0.1:$port" &
admin=$!
run_runners &
runners=$!
set +m
echo "run.sh: the admin is on http://127.0.0.1:$port/admin/ (admin / admin); Ctrl-C stops the demo"

status=0
wait "$admin" || status=$?
# Reached only when the admin stopped by itself: a signal to this script runs stop(), which exits.
trap - INT TERM
echo "run.sh: the admin stopped (exit status $status); stopping the runner" >&2
kill -TERM "$runners" 2>/dev/null || true
wait || true
exit 1
