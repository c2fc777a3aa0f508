from __future__ import annotations

import pytest

from tests import hooks


@pytest.fixture(autouse=True)
def _clear_hook_calls() -> None:
    hooks.CALLS.clear()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch):
    """A fake clock that also drives django.utils.timezone.now (services and auto_now fields)."""
    from scheduler_app.clock import FakeClock
    from tests.factories import T0

    fake = FakeClock(T0)
    monkeypatch.setattr("django.utils.timezone.now", fake.now)
    return fake
