from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests import hooks


@pytest.fixture(scope="session", autouse=True)
def _no_wake_up_pending_at_the_end(django_db_setup) -> Iterator[None]:
    """Send a wake-up still pending now: the process's sender thread would otherwise connect to the
    test database on its own while Django drops it, which PostgreSQL refuses for a database in use."""
    yield
    from scheduler_app import wakeup

    wakeup._sender.flush()


@pytest.fixture(autouse=True)
def _clear_hook_calls() -> None:
    hooks.CALLS.clear()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch):
    """A fake clock that also drives django.utils.timezone.now (services and auto_now fields)."""
    from scheduler_app.runner.clock import FakeClock
    from tests.factories import T0

    fake = FakeClock(T0)
    monkeypatch.setattr("django.utils.timezone.now", fake.now)
    return fake


RUNNER_THREAD = "runner-under-test"


@pytest.fixture
def running():
    """Start threaded Runners on the real clock (thread name RUNNER_THREAD); stop them at the end."""
    import threading

    from django.db import connections

    from scheduler_app.runner.loop import SchedulerLoop

    started: list[tuple[SchedulerLoop, threading.Thread]] = []

    def start(**options) -> SchedulerLoop:
        options.setdefault("tick_interval", 0.05)
        options.setdefault("lease_seconds", 30)
        options.setdefault("workers", 2)
        options.setdefault("drain_seconds", 10)
        runner = SchedulerLoop(node_id="worker-test", **options)
        thread = threading.Thread(target=runner.run, daemon=True, name=RUNNER_THREAD)
        thread.start()
        started.append((runner, thread))
        return runner

    yield start
    for runner, thread in started:
        runner.shutdown()
        thread.join(15)
    connections.close_all()


@pytest.fixture
def runners(tmp_path):
    """Faulty runner processes for one test (tests/system/faults.py); whatever is left is killed at teardown."""
    from tests.system.faults import Runners

    group = Runners(tmp_path)
    yield group
    for process in group.started:
        process.kill()


@pytest.fixture
def server() -> Iterator[Any]:
    """A local HTTP server on 127.0.0.1 (tests/http_servers.py)."""
    from tests.http_servers import Server, start, stop

    local = start(Server())
    yield local
    stop(local)


@pytest.fixture
def other_server() -> Iterator[Any]:
    """A second local HTTP server, on 127.0.0.2."""
    from tests.http_servers import Server, start, stop

    try:
        local = start(Server("127.0.0.2"))
    except OSError:
        pytest.skip("127.0.0.2 is not available")
    yield local
    stop(local)
