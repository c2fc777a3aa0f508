"""scheduler.next_runs() and GET tasks/{id}/next-runs/: a task's next fire times, DST applied."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import Permission, User
from rest_framework.test import APIClient

from scheduler_app import scheduler
from scheduler_app.exceptions import InvalidDefinition, TaskNotFound
from scheduler_app.models import Task
from tests.factories import definition

pytestmark = pytest.mark.django_db

API = "/api/scheduler/"
# New York springs forward on 8 March 2026: 02:30 does not exist, it fires at the jump (03:00 EDT).
BEFORE_THE_JUMP = datetime(2026, 3, 6, 12, tzinfo=UTC)


@pytest.fixture
def before_the_jump(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("scheduler_app.services.timezone.now", lambda: BEFORE_THE_JUMP)


def test_next_runs_follow_the_cron_on_the_tasks_clock(before_the_jump):
    scheduler.register(definition(cron="30 2 * * *", timezone="America/New_York"))
    assert scheduler.next_runs("report", 4) == [
        datetime(2026, 3, 7, 7, 30, tzinfo=UTC),  # 02:30 EST
        datetime(2026, 3, 8, 7, 0, tzinfo=UTC),  # 03:00 EDT: the skipped 02:30 fires at the jump
        datetime(2026, 3, 9, 6, 30, tzinfo=UTC),  # 02:30 EDT
        datetime(2026, 3, 10, 6, 30, tzinfo=UTC),
    ]
    assert len(scheduler.next_runs("report")) == 10
    scheduler.update_task("report", enabled=False)
    assert len(scheduler.next_runs("report", 2)) == 2  # a disabled task keeps its schedule


def test_next_runs_refuse_a_bad_count_and_an_unknown_task():
    scheduler.register(definition())
    for bad in (0, 101, "3", True, None):
        with pytest.raises(InvalidDefinition) as refused:
            scheduler.next_runs("report", bad)  # type: ignore[arg-type]
        assert refused.value.errors == {"n": ["Must be an integer from 1 to 100."]}
    for missing in ("nope", "bad\x00id", 7):
        with pytest.raises(TaskNotFound):
            scheduler.next_runs(missing)  # type: ignore[arg-type]


def test_a_stored_schedule_that_cannot_be_evaluated_gives_no_times():
    scheduler.register(definition())
    Task.objects.filter(id="report").update(timezone="Mars/Base")
    assert scheduler.next_runs("report") == []


def test_the_rest_form_gives_utc_and_local_times(before_the_jump):
    scheduler.register(definition(cron="30 2 * * *", timezone="America/New_York"))
    user = User.objects.create_user("ops", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename="view_task"))
    client = APIClient()
    client.force_login(User.objects.get(pk=user.pk))
    response = client.get(API + "tasks/report/next-runs/", {"n": 2})
    assert response.status_code == 200, response.content
    assert response.json() == {
        "task_id": "report",
        "cron": "30 2 * * *",
        "run_at": None,
        "timezone": "America/New_York",
        "starts_at": None,
        "ends_at": None,
        "jitter_seconds": 0,
        "enabled": True,
        "disabled_until": None,
        "next_runs": [
            {
                "at": "2026-03-07T07:30:00Z",
                "local": "2026-03-07T02:30:00-05:00",
                "due": "2026-03-07T07:30:00Z",
                "runs": True,
            },
            {
                "at": "2026-03-08T07:00:00Z",
                "local": "2026-03-08T03:00:00-04:00",
                "due": "2026-03-08T07:00:00Z",
                "runs": True,
            },
        ],
    }
    assert client.get(API + "tasks/report/next-runs/", {"n": 0}).json()["code"] == "scheduler:012"
    assert client.get(API + "tasks/nope/next-runs/").status_code == 404
    stranger = APIClient()
    stranger.force_login(User.objects.create_user("guest", is_staff=True))
    assert stranger.get(API + "tasks/report/next-runs/").status_code == 403


def test_the_rest_form_shows_the_window_the_jittered_due_times_and_what_a_pause_skips(before_the_jump):
    from datetime import timedelta

    from scheduler_app.models import scheduled_occurrence_id
    from scheduler_app.schedule import jitter

    starts, ends = datetime(2026, 3, 7, 10, tzinfo=UTC), datetime(2026, 3, 7, 13, tzinfo=UTC)
    scheduler.register(definition(cron="0 * * * *", starts_at=starts, ends_at=ends, jitter_seconds=600))
    scheduler.pause("report", until=datetime(2026, 3, 7, 11, 30, tzinfo=UTC))
    user = User.objects.create_user("ops", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename="view_task"))
    client = APIClient()
    client.force_login(user)
    found = client.get(API + "tasks/report/next-runs/").json()
    assert (found["starts_at"], found["ends_at"], found["jitter_seconds"], found["enabled"]) == (
        "2026-03-07T10:00:00Z",
        "2026-03-07T13:00:00Z",
        600,
        False,
    )
    assert found["disabled_until"] == "2026-03-07T11:30:00Z"
    fires = [starts + timedelta(hours=n) for n in range(3)]
    assert [run["at"] for run in found["next_runs"]] == [f"{f:%Y-%m-%dT%H:%M:%SZ}" for f in fires]
    assert [run["runs"] for run in found["next_runs"]] == [False, False, True]
    dues = [f + jitter(600, scheduled_occurrence_id("report", f)) for f in fires]
    assert [datetime.fromisoformat(run["due"]) for run in found["next_runs"]] == dues
    assert any(due != fire for due, fire in zip(dues, fires, strict=True))
