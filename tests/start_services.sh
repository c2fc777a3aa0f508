#!/usr/bin/env bash
# Start PostgreSQL, MariaDB and Redis where they are installed but down; install them where missing.
set -uo pipefail

wait_for() {  # wait_for NAME COMMAND...: poll until the command succeeds, 60 s at most
    local name=$1; shift
    for _ in $(seq 120); do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
    echo "$name did not come up" >&2; return 1
}

need_install=0
command -v pg_ctlcluster >/dev/null || need_install=1
[ -x /usr/sbin/mariadbd ] || need_install=1
command -v redis-server >/dev/null || need_install=1
if [ "$need_install" = 1 ]; then
    apt-get update -qq && apt-get install -y -qq postgresql mariadb-server redis-server >/dev/null
fi

if ! pg_isready -q -h 127.0.0.1 -p 5432; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start
    wait_for postgresql pg_isready -q -h 127.0.0.1 -p 5432
fi
if ! mysqladmin -h 127.0.0.1 -uroot ping >/dev/null 2>&1; then
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
    wait_for mariadb mysqladmin -h 127.0.0.1 -uroot ping
fi
if ! redis-cli -h 127.0.0.1 ping >/dev/null 2>&1; then
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
        --dir /var/lib/redis --logfile /var/log/redis/ci.log
    wait_for redis redis-cli -h 127.0.0.1 ping
fi
exit 0
