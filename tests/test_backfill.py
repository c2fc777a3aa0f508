"""Backfill (#18 section 4): the fire times of a past range that have no execution are listed
(dry run) or created as the scheduled occurrences they would have been, so that neither a second
backfill nor a runner catching up can duplicate one. The Python API, the runner, the REST API and
the admin; the runner runs inline on an injected clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission, User
from rest_framework.test import APIClient

from scheduler_app import backfill, health, occurrences, scheduler
from scheduler_app.admin import task_health
from scheduler_app.exceptions import Conflict, InvalidDefinition, TaskNotFound
from scheduler_app.models import Execution, ExecutionEvent, Status, Task, TriggerType, scheduled_occurrence_id
from scheduler_app.runner import claims, scheduling
from tests import hooks
from tests.factories import T0, definition, inline_runner

pytestmark = pytest.mark.django_db

MINUTE = timedelta(minutes=1)
TASKS = "/admin/scheduler_app/task/"


def minutes(*offsets: int) -> list[datetime]:
    return [T0 + n * MINUTE for n in offsets]


def journal_size() -> tuple[int, int]:
    return Execution.objects.count(), ExecutionEvent.objects.count()


def paused_between(clock, start: int, end: int, task_id: str = "report") -> None:
    """A runner ran the task (registered at 09:00) each minute from 09:01 to minute ``start``, then it
    was paused until minute ``end``."""
    runner = inline_runner(clock)
    for minute in range(1, start + 1):
        clock.set(T0 + minute * MINUTE)
        runner.tick()
    scheduler.pause(task_id, reason="maintenance")
    clock.set(T0 + end * MINUTE + timedelta(seconds=10))
    scheduler.resume(task_id)
    runner.tick()


# -- the Python API --------------------------------------------------------------------------


def test_a_dry_run_lists_the_fire_times_of_the_range_without_an_execution_and_writes_nothing(clock):
    scheduler.register(definition(cron="*/5 * * * *"))
    clock.set(T0 + timedelta(hours=1))
    before = journal_size()
    planned = scheduler.backfill("report", T0 - timedelta(minutes=20), T0 + timedelta(minutes=1))
    assert [e.scheduled_for for e in planned] == minutes(-20, -15, -10, -5, 0)
    assert all(e.pk is None and e.status == Status.PENDING for e in planned)
    assert [e.occurrence_id for e in planned] == [
        scheduled_occurrence_id("report", e.scheduled_for) for e in planned
    ]
    assert journal_size() == before


def test_a_backfill_creates_the_paused_minutes_with_their_own_ids_and_a_second_one_creates_nothing(clock):
    scheduler.register(definition())
    paused_between(clock, 2, 6)
    ran = set(Execution.objects.values_list("scheduled_for", flat=True))
    assert ran == set(minutes(1, 2))
    with scheduler.acting_as("ops-bot"):
        created = scheduler.backfill("report", T0 + MINUTE, T0 + 10 * MINUTE, dry_run=False)
    # 09:03 to 09:06 were paused; 09:07 onwards are the runners' (the next run is 09:07).
    assert [e.scheduled_for for e in created] == minutes(3, 4, 5, 6)
    rows = Execution.objects.filter(trigger_source="backfill").order_by("scheduled_for")
    assert [(r.status, r.trigger_type, r.occurrence_id) for r in rows] == [
        (Status.PENDING, TriggerType.SCHEDULED, scheduled_occurrence_id("report", at))
        for at in minutes(3, 4, 5, 6)
    ]
    reasons = ExecutionEvent.objects.filter(execution__in=rows).values_list("reason", flat=True)
    assert set(reasons) == {"backfilled by ops-bot"}
    before = journal_size()
    assert scheduler.backfill("report", T0 + MINUTE, T0 + 10 * MINUTE, dry_run=False) == []
    assert scheduler.backfill("report", T0 + MINUTE, T0 + 10 * MINUTE) == []
    assert journal_size() == before


def test_backfilled_occurrences_run_once_each_oldest_first_and_a_catching_up_runner_adds_none(clock):
    scheduler.register(definition())
    paused_between(clock, 0, 3)
    hooks.CALLS.clear()
    scheduler.backfill("report", T0 + MINUTE, T0 + 4 * MINUTE, dry_run=False)
    runner = inline_runner(clock, workers=1)
    for _ in range(6):
        runner.tick()
    started = [call.context.occurrence_id for call in hooks.CALLS]
    assert started == [str(scheduled_occurrence_id("report", at)) for at in minutes(1, 2, 3)]
    backfilled = Execution.objects.filter(trigger_source="backfill")
    assert sorted(backfilled.values_list("status", flat=True)) == [Status.SUCCESS] * 3
    # However late a runner plans the same minutes, their ids exist: nothing more is created.
    Task.objects.update(next_run_at=T0 + MINUTE)
    before = Execution.objects.exclude(status=Status.INTERRUPTED).count()
    scheduling.schedule_due(T0 + 3 * MINUTE + timedelta(seconds=20), "node-b")
    ids = [scheduled_occurrence_id("report", at) for at in minutes(1, 2, 3)]
    assert Execution.objects.filter(occurrence_id__in=ids).count() == 3
    # What it planned is the misfire record of 09:01 and 09:02 (their ids exist) and 09:03's run.
    assert Execution.objects.exclude(status=Status.INTERRUPTED).count() == before


def test_a_backfill_queues_under_max_concurrency_instead_of_following_the_overlap_policy(clock):
    scheduler.register(definition(overlap="skip"))
    paused_between(clock, 0, 3)
    scheduler.backfill("report", T0 + MINUTE, T0 + 4 * MINUTE, dry_run=False)
    (first,), _, _ = claims.claim(clock.now(), "node-a", 4, 600)
    assert first.execution.scheduled_for == T0 + MINUTE
    # The others wait for the slot, pending; none is skipped.
    waiting = Execution.objects.filter(trigger_source="backfill", status=Status.PENDING)
    assert sorted(waiting.values_list("scheduled_for", flat=True)) == minutes(2, 3)
    assert claims.claim(clock.now(), "node-a", 4, 600) == ([], [], True)


def test_misfire_skipped_fire_times_are_backfilled_and_coalesced_ones_are_not(clock):
    scheduler.register(definition(misfire_grace_seconds=300))
    # 09:01 to 09:05 are skipped (past the grace); 09:06 to 09:09 merge into 09:10's run.
    clock.set(T0 + timedelta(minutes=10, seconds=30))
    scheduling.schedule_due(clock.now(), "node-a")
    planned = scheduler.backfill("report", T0 + MINUTE, T0 + 11 * MINUTE)
    assert [e.scheduled_for for e in planned] == minutes(1, 2, 3, 4, 5)


def test_a_fire_time_a_coalesced_run_after_the_range_merged_is_not_backfilled(clock):
    scheduler.register(definition(misfire_grace_seconds=300))
    clock.set(T0 + timedelta(minutes=10, seconds=30))
    scheduling.schedule_due(clock.now(), "node-a")
    # The range ends before the run (09:10) that merged 09:06 to 09:09.
    planned = scheduler.backfill("report", T0 + 4 * MINUTE, T0 + 8 * MINUTE)
    assert [e.scheduled_for for e in planned] == minutes(4, 5)


def test_an_occurrence_skipped_by_the_overlap_policy_has_an_execution(clock):
    scheduler.register(definition(overlap="skip"))
    scheduler.trigger("report")
    claims.claim(T0, "node-a", 1, 600)
    scheduling.schedule_due(T0 + MINUTE, "node-a")
    assert Execution.objects.get(scheduled_for=T0 + MINUTE).error["reason"] == "overlap"
    clock.set(T0 + 2 * MINUTE)
    assert scheduler.backfill("report", T0 + MINUTE, T0 + 2 * MINUTE) == []


def test_fire_times_the_runners_have_not_passed_are_left_to_them(clock):
    scheduler.register(definition())
    clock.set(T0 + timedelta(minutes=5, seconds=30))
    # Nothing ran: the next run is 09:01 (registered at 09:00), so nothing is the backfill's.
    planned = scheduler.backfill("report", T0 - 10 * MINUTE, T0 + timedelta(hours=2))
    assert [e.scheduled_for for e in planned] == minutes(*range(-10, 1))


def test_jitter_and_params_are_those_of_a_scheduled_occurrence(clock):
    scheduler.register(definition(cron="0 * * * *", jitter_seconds=600, params={"channel": "ops"}))
    clock.set(T0 + timedelta(hours=5))
    Task.objects.update(next_run_at=T0 + timedelta(hours=6))
    (created,) = scheduler.backfill("report", T0, T0 + MINUTE, dry_run=False)
    occurrence_id = scheduled_occurrence_id("report", T0)
    expected_due = T0 + timedelta(milliseconds=occurrence_id.int % 600_000)
    stored = Execution.objects.get(occurrence_id=occurrence_id)
    assert (stored.due_at, stored.params, stored.scheduled_for) == (expected_due, {"channel": "ops"}, T0)
    assert created.sequence == stored.sequence


def test_a_backfill_over_the_cap_is_refused_naming_where_to_end_and_writes_nothing(clock, monkeypatch):
    monkeypatch.setattr(backfill, "MAX_CREATED", 3)
    scheduler.register(definition())
    clock.set(T0 + timedelta(hours=1))
    before = journal_size()
    with pytest.raises(InvalidDefinition) as refused:
        scheduler.backfill("report", T0 - 10 * MINUTE, T0, dry_run=False)
    assert refused.value.code == "scheduler:012"
    assert refused.value.errors == {
        "end": [
            "10 fire times in the range have no execution, more than 3 per backfill; end the range at "
            "or before 2026-03-02T08:53Z and backfill the rest after."
        ]
    }
    assert journal_size() == before
    assert len(scheduler.backfill("report", T0 - 10 * MINUTE, T0 - 7 * MINUTE, dry_run=False)) == 3


def test_a_range_with_too_many_fire_times_to_read_is_refused(clock, monkeypatch):
    monkeypatch.setattr(backfill, "MAX_SCANNED", 50)
    scheduler.register(definition())
    clock.set(T0 + timedelta(days=1))
    with pytest.raises(InvalidDefinition) as refused:
        scheduler.backfill("report", T0 - timedelta(days=1), T0)
    assert refused.value.errors == {
        "end": ["The range holds more than 50 fire times; end it at or before 2026-03-01T09:50Z."]
    }


@pytest.mark.parametrize(
    ("start", "end", "errors"),
    [
        (datetime(2026, 3, 1), T0, {"start": ["Must be a timezone-aware datetime."]}),
        (T0, "2026-03-02", {"end": ["Must be a timezone-aware datetime."]}),
        (T0, T0, {"end": ["Must be after start."]}),
        (T0, T0 - MINUTE, {"end": ["Must be after start."]}),
        (datetime(1900, 1, 1, tzinfo=UTC), T0, {"start": ["Must lie in the years 2000 to 2200."]}),
    ],
)
def test_a_backfill_needs_an_aware_range_that_ends_after_it_starts(clock, start, end, errors):
    scheduler.register(definition())
    with pytest.raises(InvalidDefinition) as refused:
        scheduler.backfill("report", start, end, dry_run=False)
    assert refused.value.errors == errors


def test_with_journal_retention_a_backfill_starts_within_it(clock, settings):
    from scheduler_app import retention

    settings.SCHEDULER_APP = {**settings.SCHEDULER_APP, "JOURNAL_RETENTION_DAYS": 30}
    scheduler.register(definition(cron="0 9 * * *"))
    Task.objects.update(next_run_at=T0 + timedelta(days=41))
    clock.set(T0 + timedelta(days=10))
    assert len(scheduler.backfill("report", T0, T0 + timedelta(days=5), dry_run=False)) == 5
    Execution.objects.update(status=Status.SUCCESS, finished_at=T0 + timedelta(days=5))
    clock.set(T0 + timedelta(days=40))
    retention.prune_journal(clock.now())
    assert not Execution.objects.exists()
    # Those fire times ran; their executions are gone: a backfill must not run them again.
    with pytest.raises(InvalidDefinition) as refused:
        scheduler.backfill("report", T0, T0 + timedelta(days=5))
    assert refused.value.errors["start"][0].startswith("Must be at most 30 days ago (JOURNAL_RETENTION_DAYS)")
    planned = scheduler.backfill("report", clock.now() - timedelta(days=30), clock.now())
    assert planned[0].scheduled_for == T0 + timedelta(days=10)


def test_a_backfill_of_a_missing_task_is_refused(clock):
    with pytest.raises(TaskNotFound):
        scheduler.backfill("nope", T0 - MINUTE, T0)
    with pytest.raises(TaskNotFound):
        scheduler.backfill("bad\x00id", T0 - MINUTE, T0)
    scheduler.register(definition())
    with pytest.raises(InvalidDefinition):
        scheduler.backfill("report", T0 - MINUTE, T0, dry_run="no")  # type: ignore[arg-type]


def run_until(runner, clock, done, ticks: int = 40) -> None:
    """Tick (a second apart) until ``done()`` holds; at most ``ticks`` ticks."""
    for _ in range(ticks):
        if done():
            return
        clock.advance(1)
        runner.tick()
    assert done()


def test_a_pause_in_the_middle_of_a_backfill_holds_the_rest_and_the_resume_runs_them(clock):
    scheduler.register(definition())
    paused_between(clock, 0, 4)
    hooks.CALLS.clear()
    scheduler.backfill("report", T0 + MINUTE, T0 + 5 * MINUTE, dry_run=False)
    backfilled = Execution.objects.filter(trigger_source="backfill")
    runner = inline_runner(clock, workers=1)
    run_until(runner, clock, lambda: backfilled.filter(status=Status.SUCCESS).exists())
    scheduler.pause("report", reason="downstream is down")
    for _ in range(5):
        clock.advance(1)
        runner.tick()
    # Held, not ended: still pending, so a second backfill finds nothing to add and none is lost.
    assert sorted(backfilled.values_list("status", flat=True)) == [Status.PENDING] * 3 + [Status.SUCCESS]
    assert scheduler.backfill("report", T0 + MINUTE, T0 + 5 * MINUTE) == []
    assert health.check(clock.now() + timedelta(hours=1)).late == 0
    scheduler.resume("report")
    run_until(runner, clock, lambda: backfilled.filter(status=Status.SUCCESS).count() == 4)
    started = [call.context.occurrence_id for call in hooks.CALLS]
    assert started == [str(scheduled_occurrence_id("report", at)) for at in minutes(1, 2, 3, 4)]


def test_a_backfill_of_a_paused_task_waits_for_its_resume(clock):
    scheduler.register(definition())
    paused_between(clock, 0, 3)
    scheduler.pause("report", reason="not yet")
    created = scheduler.backfill("report", T0 + MINUTE, T0 + 4 * MINUTE, dry_run=False)
    assert [e.scheduled_for for e in created] == minutes(1, 2, 3)
    assert claims.claim(clock.now(), "node-a", 4, 600) == ([], [], True)
    assert set(Execution.objects.filter(trigger_source="backfill").values_list("status", flat=True)) == {
        Status.PENDING
    }
    scheduler.resume("report")
    (first,), _, _ = claims.claim(clock.now(), "node-a", 4, 600)
    assert first.execution.scheduled_for == T0 + MINUTE


def test_a_backfill_of_a_task_still_paused_reaches_its_paused_minutes_up_to_now(clock):
    """The runners create none of a paused task's fire times: the backfill is not stopped at the
    next run the task had when it was paused."""
    scheduler.register(definition())
    runner = inline_runner(clock)
    for minute in (1, 2):
        clock.set(T0 + minute * MINUTE)
        runner.tick()
    scheduler.pause("report", reason="maintenance")
    clock.set(T0 + 6 * MINUTE + timedelta(seconds=10))
    planned = scheduler.backfill("report", T0, T0 + timedelta(hours=1))
    assert [e.scheduled_for for e in planned] == minutes(0, 3, 4, 5, 6)


def test_a_backfill_of_a_task_paused_until_a_time_stops_there_for_the_runner(clock):
    scheduler.register(definition())
    scheduler.pause("report", until=T0 + 3 * MINUTE)
    clock.set(T0 + 5 * MINUTE + timedelta(seconds=10))
    planned = scheduler.backfill("report", T0 - MINUTE, T0 + timedelta(hours=1))
    assert [e.scheduled_for for e in planned] == minutes(-1, 0, 1, 2)
    runner = inline_runner(clock)
    for _ in range(3):
        runner.tick()
    # The runner resumed the task from 09:03 on: the fire times before it were the backfill's.
    ran = Execution.objects.filter(status=Status.SUCCESS).values_list("scheduled_for", flat=True)
    assert list(ran) == minutes(5)
    skipped = Execution.objects.get(status=Status.INTERRUPTED).missed_fire_times
    assert skipped["listed"] == ["2026-03-02T09:03:00Z", "2026-03-02T09:04:00Z"]


def test_a_backfill_lists_no_fire_time_outside_the_task_window(clock):
    scheduler.register(definition(starts_at=T0 + 2 * MINUTE, ends_at=T0 + 5 * MINUTE))
    clock.set(T0 + timedelta(hours=1))
    # The runner passes the window long after it: its fire times are skipped as misfires.
    scheduling.schedule_due(clock.now(), "node-a")
    assert Task.objects.get().next_run_at is None
    planned = scheduler.backfill("report", T0 - timedelta(minutes=30), T0 + timedelta(minutes=30))
    assert [e.scheduled_for for e in planned] == minutes(2, 3, 4)


def test_a_claim_that_read_backfilled_rows_before_a_pause_leaves_them_pending(clock, monkeypatch):
    from scheduler_app import statements

    scheduler.register(definition())
    paused_between(clock, 0, 3)
    scheduler.backfill("report", T0 + MINUTE, T0 + 4 * MINUTE, dry_run=False)
    chosen = statements.journal_statements()
    read_before = chosen.candidates(clock.now(), 10)
    assert len(read_before) == 3
    scheduler.pause("report")
    monkeypatch.setattr(type(chosen), "candidates", lambda self, now, limit: read_before)
    assert claims.claim(clock.now(), "node-a", 10, 600) == ([], [], True)
    backfilled = Execution.objects.filter(trigger_source="backfill")
    assert set(backfilled.values_list("status", flat=True)) == {Status.PENDING}


def test_rows_a_pause_holds_do_not_stand_in_the_way_of_other_tasks(clock):
    """However many backfilled rows of paused tasks are due before them, other rows are claimed:
    the claim's read of due rows leaves the held ones out, on PostgreSQL's fixed statements as
    through the ORM."""
    scheduler.register(definition())
    scheduler.register(definition("other", cron="0 0 1 1 *"))
    task = Task.objects.get(id="report")
    held = [
        occurrences.scheduled(task, T0 - n * MINUTE, clock.now(), Status.PENDING, source="backfill")
        for n in range(1, 61)
    ]
    occurrences.insert([(row, "backfilled") for row in held], "", clock.now())
    scheduler.pause("report")
    triggered = scheduler.trigger("other")
    clock.advance(1)
    (taken,), ended, _ = claims.claim(clock.now(), "node-a", 1, 600)
    assert (taken.execution.sequence, ended) == (triggered.sequence, [])
    assert Execution.objects.filter(task_id="report", status=Status.PENDING).count() == 60


def test_backfilled_rows_are_late_only_once_they_wait_past_the_grace_and_never_while_held(clock):
    scheduler.register(definition())
    paused_between(clock, 0, 3)
    scheduler.backfill("report", T0 + MINUTE, T0 + 4 * MINUTE, dry_run=False)
    now = clock.now()
    assert health.check(now + timedelta(seconds=30)).late == 0  # due long ago, created just now
    assert health.check(now + timedelta(seconds=61)).late == 3
    scheduler.pause("report")
    assert health.check(now + timedelta(hours=1)).late == 0
    shown = task_health.annotate(Task.objects.filter(id="report"), now + timedelta(hours=1)).get()
    assert shown.health == "paused"


def test_a_task_changed_between_plan_and_creation_is_a_conflict(clock):
    scheduler.register(definition())
    clock.set(T0 + timedelta(hours=1))
    found = backfill.plan("report", T0 - 5 * MINUTE, T0, clock.now())
    scheduler.update_task("report", cron="*/2 * * * *")
    with pytest.raises(Conflict):
        backfill.create(found, clock.now())
    assert not Execution.objects.exists()


# -- the REST API ------------------------------------------------------------------------------


def api_user(*permissions: str) -> APIClient:
    user = User.objects.create_user("operator", is_staff=True)
    for name in permissions:
        user.user_permissions.add(Permission.objects.get(codename=name))
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_the_rest_api_previews_then_creates_a_backfill(clock):
    scheduler.register(definition(timezone="Europe/Berlin"))
    paused_between(clock, 0, 2)
    client = api_user("add_execution")
    url = "/api/scheduler/tasks/report/backfill/"
    body = {"start": "2026-03-02T10:01:00+01:00", "end": "2026-03-02T10:05:00+01:00"}
    preview = client.post(url, body, format="json")
    assert preview.status_code == 200
    assert preview.json() == {
        "task_id": "report",
        "dry_run": True,
        "count": 2,
        "fire_times": [
            {"at": "2026-03-02T09:01:00Z", "local": "2026-03-02T10:01:00+01:00"},
            {"at": "2026-03-02T09:02:00Z", "local": "2026-03-02T10:02:00+01:00"},
        ],
        "executions": [],
    }
    assert not Execution.objects.filter(trigger_source="backfill").exists()
    done = client.post(url, {**body, "dry_run": False}, format="json")
    assert done.status_code == 202
    data = done.json()
    assert (data["dry_run"], data["count"]) == (False, 2)
    assert [e["occurrence_id"] for e in data["executions"]] == [
        str(scheduled_occurrence_id("report", at)) for at in minutes(1, 2)
    ]
    assert "execution_token" not in data["executions"][0]
    again = client.post(url, {**body, "dry_run": False}, format="json")
    assert (again.status_code, again.json()["count"]) == (200, 0)


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"start": "2026-03-02T10:05:00+01:00", "end": "2026-03-02T10:00:00+01:00"}, 400, "scheduler:012"),
        ({"start": "not a time", "end": "2026-03-02T10:05:00+01:00"}, 400, "scheduler:012"),
        (
            {"start": "2026-03-02T10:00:00+01:00", "end": "2026-03-02T10:05:00+01:00", "dry_run": "x"},
            400,
            None,
        ),
        ({"start": "2026-03-02T10:00:00+01:00", "end": "2026-03-02T10:05:00+01:00", "other": 1}, 400, None),
    ],
)
def test_the_rest_api_refuses_a_bad_backfill_and_writes_nothing(clock, body, status, code):
    scheduler.register(definition())
    before = journal_size()
    response = api_user("add_execution").post("/api/scheduler/tasks/report/backfill/", body, format="json")
    assert response.status_code == status
    if code:
        assert response.json()["code"] == code
    assert journal_size() == before


def test_the_rest_backfill_needs_the_add_execution_permission_and_a_task(clock):
    scheduler.register(definition())
    body = {"start": "2026-03-02T08:00:00Z", "end": "2026-03-02T09:00:00Z"}
    refused = api_user("view_task").post("/api/scheduler/tasks/report/backfill/", body, format="json")
    assert refused.status_code == 403
    User.objects.all().delete()
    missing = api_user("add_execution").post("/api/scheduler/tasks/nope/backfill/", body, format="json")
    assert (missing.status_code, missing.json()["code"]) == (404, "scheduler:020")


# -- the admin -----------------------------------------------------------------------------------


def chosen(action: str, *task_ids: str, **values: str) -> dict:
    return {"action": action, "_selected_action": list(task_ids), **values}


def test_the_admin_backfill_asks_for_a_range_previews_each_task_then_creates(clock, admin_client):
    scheduler.register(definition())
    scheduler.register(definition("sweep", cron="*/2 * * * *"))
    scheduler.register(definition("idle", cron="0 0 1 1 *"))
    scheduler.register(definition("broken"))
    Task.objects.filter(id="broken").update(cron="61 * * * *")  # stored around validation
    paused_between(clock, 0, 4)
    scheduler.pause("sweep", reason="later")
    every = ("report", "sweep", "idle", "broken")
    asked = admin_client.post(TASKS, chosen("backfill", *every))
    assert asked.status_code == 200
    assert asked.context["form"].fields.keys() == {"start", "end"}
    values = {"start": "2026-03-02 09:01:00", "end": "2026-03-02 09:10:00"}
    preview = admin_client.post(TASKS, chosen("backfill", *every, post="yes", **values))
    page = preview.content.decode()
    assert preview.status_code == 200
    assert [row.task.id for row in preview.context["previews"]] == ["broken", "idle", "report", "sweep"]
    assert "2026-03-02 09:01:00 UTC" in page and "2026-03-02 09:04:00 UTC" in page
    assert "has a schedule that cannot be evaluated" in page
    # The paused task's misfire-skipped 09:02 is listed, to wait for its resume.
    assert "1 fire time, waiting until the task is resumed: it is paused" in page
    assert 'value="Backfill 5 fire times"' in page
    assert not Execution.objects.filter(trigger_source="backfill").exists()
    done = admin_client.post(
        TASKS, chosen("backfill", *every, post="yes", confirm="yes", **values), follow=True
    )
    created = Execution.objects.filter(trigger_source="backfill").order_by("task_id", "scheduled_for")
    assert [(e.task_id, e.scheduled_for) for e in created] == [
        *(("report", at) for at in minutes(1, 2, 3, 4)),
        ("sweep", T0 + 2 * MINUTE),
    ]
    shown = [str(m) for m in done.context["messages"]]
    assert "Backfilled 2 tasks: report (4 fire times), sweep (1 fire time)." in shown
    assert any(m.startswith("Could not backfill 1 task: broken") for m in shown)
    assert "Nothing to backfill for 1 task: idle." in shown


def test_the_admin_backfill_needs_the_run_now_permission(clock, client):
    scheduler.register(definition())
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_task"))
    user.user_permissions.add(Permission.objects.get(codename="change_task"))
    client.force_login(user)
    listed = client.get(TASKS)
    assert "backfill" not in dict(listed.context["action_form"].fields["action"].choices)
