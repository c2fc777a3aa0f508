"""Schedules beyond a cron expression (#18): one-shot tasks, active windows, jitter, and what a
misfire records under each misfire policy. The runner runs inline on an injected clock."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from rest_framework.test import APIClient

from scheduler_app import schedule, scheduler
from scheduler_app.exceptions import InvalidCron, InvalidDefinition
from scheduler_app.models import (
    Execution,
    Status,
    Task,
    TaskChange,
    TriggerType,
    missed_occurrence_id,
    scheduled_occurrence_id,
)
from scheduler_app.runner import claims, scheduling
from tests import hooks
from tests.factories import T0, definition, inline_runner, ran_once, task_form

pytestmark = pytest.mark.django_db

MINUTE = timedelta(minutes=1)


def one_shot(at: datetime, **overrides):
    return definition(cron=None, run_at=at, **overrides)


# -- one-shot tasks ---------------------------------------------------------------


def test_a_one_shot_task_fires_once_at_its_instant_and_then_has_no_next_run(clock):
    at = T0 + timedelta(minutes=5, seconds=30)
    task = scheduler.register(one_shot(at))
    assert (task.cron, task.run_at, task.next_run_at) == ("", at, at)
    runner = inline_runner(clock)
    clock.set(at - timedelta(seconds=1))
    runner.tick()
    assert not Execution.objects.exists()
    clock.set(at)
    runner.tick()
    execution = Execution.objects.get()
    assert (execution.status, execution.scheduled_for, execution.due_at) == (Status.SUCCESS, at, at)
    assert execution.occurrence_id == scheduled_occurrence_id("report", at)
    assert Task.objects.get().next_run_at is None
    clock.advance(86400)
    runner.tick()
    assert Execution.objects.count() == 1
    assert hooks.started() == ran_once("report", execution.occurrence_id)
    assert scheduler.next_runs("report") == []


def test_a_one_shot_in_the_minute_of_an_earlier_run_of_the_task_fires_at_its_second(clock):
    """Occurrence ids of whole minutes (every cron fire time) leave room for a run_at off the minute:
    a cron run at 10:00, then run_at 10:00:40, is a run of its own, not the 10:00 run again."""
    scheduler.register(definition(cron="0 10 * * *"))
    runner = inline_runner(clock)
    clock.set(T0.replace(hour=10))
    runner.tick()
    at = T0.replace(hour=10, second=40)
    scheduler.update_task("report", run_at=at)
    clock.set(at)
    runner.tick()
    rows = Execution.objects.order_by("sequence")
    assert [(row.scheduled_for, row.status) for row in rows] == [
        (T0.replace(hour=10), Status.SUCCESS),
        (at, Status.SUCCESS),
    ]
    assert rows[1].occurrence_id == scheduled_occurrence_id("report", at) != rows[0].occurrence_id
    assert scheduled_occurrence_id("report", T0.replace(hour=10)) == rows[0].occurrence_id


def test_a_one_shot_task_with_delete_after_run_is_deleted_after_its_success(clock):
    scheduler.register(one_shot(T0 + MINUTE, delete_after_run=True))
    runner = inline_runner(clock)
    clock.set(T0 + MINUTE)
    runner.tick()
    runner.tick()
    assert Execution.objects.get().status == Status.SUCCESS
    assert not Task.objects.exists()


def test_a_one_shot_task_run_now_before_its_instant_is_kept_for_its_scheduled_run(clock):
    scheduler.register(one_shot(T0 + timedelta(hours=1), delete_after_run=True))
    runner = inline_runner(clock)
    scheduler.trigger("report")
    runner.tick()
    assert Execution.objects.get().status == Status.SUCCESS
    assert Task.objects.get().next_run_at == T0 + timedelta(hours=1)
    clock.set(T0 + timedelta(hours=1))
    runner.tick()
    ran = Execution.objects.order_by("sequence")
    assert list(ran.values_list("trigger_type", "status")) == [
        (TriggerType.MANUAL, Status.SUCCESS),
        (TriggerType.SCHEDULED, Status.SUCCESS),
    ]
    assert not Task.objects.exists()


def test_a_one_shot_task_that_misfired_stays_until_a_run_of_it_succeeds(clock):
    scheduler.register(one_shot(T0 - timedelta(hours=2), delete_after_run=True))
    runner = inline_runner(clock)
    runner.tick()
    assert Execution.objects.get().error["reason"] == "misfire"
    clock.advance(86400)
    runner.tick()
    task = Task.objects.get()
    assert (task.enabled, task.next_run_at) == (True, None)
    scheduler.trigger("report")
    runner.tick()
    assert not Task.objects.exists()


def test_a_one_shot_whose_instant_passed_runs_at_once_within_the_grace_and_is_a_misfire_beyond(clock):
    scheduler.register(one_shot(T0 - timedelta(seconds=30), id="recent"))
    scheduler.register(one_shot(T0 - timedelta(hours=2), id="stale"))
    inline_runner(clock).tick()
    recent = Execution.objects.get(task_id="recent")
    assert recent.status == Status.SUCCESS
    stale = Execution.objects.get(task_id="stale")
    assert (stale.status, stale.error["reason"]) == (Status.INTERRUPTED, "misfire")
    assert stale.missed_fire_times["count"] == 1
    assert Task.objects.get(id="stale").next_run_at is None


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"cron": "* * * * *", "run_at": T0}, "run_at"),
        ({"cron": ""}, "cron"),
        ({"cron": None, "run_at": "2026-03-02T09:00:00"}, "run_at"),
        ({"cron": None, "run_at": datetime(2026, 3, 2, 9)}, "run_at"),
        ({"cron": None, "run_at": "tomorrow"}, "run_at"),
        ({"cron": None, "run_at": datetime(1999, 1, 1, tzinfo=UTC)}, "run_at"),
    ],
)
def test_a_task_has_exactly_one_schedule_and_an_aware_instant(data, field):
    with pytest.raises((InvalidDefinition, InvalidCron)) as raised:
        scheduler.register({"id": "report", **data})
    assert field in raised.value.errors
    assert not Task.objects.exists()


def test_run_at_given_as_iso_text_with_an_offset_is_stored_in_utc():
    task = scheduler.register(definition(cron=None, run_at="2026-03-02T10:00:00+01:00"))
    assert task.run_at == T0


def test_an_update_that_sets_one_schedule_clears_the_other(clock):
    scheduler.register(definition())
    task = scheduler.update_task("report", run_at=T0 + timedelta(hours=1))
    assert (task.cron, task.run_at, task.next_run_at) == (
        "",
        T0 + timedelta(hours=1),
        T0 + timedelta(hours=1),
    )
    task = scheduler.update_task("report", cron="0 12 * * *")
    assert (task.cron, task.run_at, task.next_run_at) == ("0 12 * * *", None, T0.replace(hour=12))
    with pytest.raises(InvalidDefinition):
        scheduler.update_task("report", cron="0 1 * * *", run_at=T0 + MINUTE)
    with pytest.raises(InvalidCron):
        scheduler.update_task("report", cron=None)
    assert Task.objects.get().cron == "0 12 * * *"
    change = TaskChange.objects.filter(task_id="report").order_by("id")[1]
    assert change.changes["run_at"] == [None, "2026-03-02T10:00:00Z"]


def test_a_pending_one_shot_occurrence_is_interrupted_when_run_at_moves(clock):
    scheduler.register(one_shot(T0 + MINUTE))
    clock.set(T0 + MINUTE)
    scheduling.schedule_due(clock.now(), "node-a")
    scheduler.update_task("report", run_at=T0 + timedelta(hours=1))
    claimed, ended, _ = claims.claim(clock.now(), "node-a", 10, 30)
    assert not claimed
    assert ended[0].execution.error["message"].startswith("rescheduled")


def test_a_one_shot_disabled_past_its_instant_does_not_run_when_enabled(clock):
    scheduler.register(one_shot(T0 + MINUTE, enabled=False))
    clock.set(T0 + timedelta(minutes=5))
    task = scheduler.update_task("report", enabled=True)
    assert task.next_run_at is None
    inline_runner(clock).tick()
    assert not Execution.objects.exists()


def test_the_rest_api_creates_and_shows_a_one_shot_task(admin_client):
    response = admin_client.post(
        "/api/scheduler/tasks/",
        {"id": "once", "run_at": "2026-03-02T10:00:00+01:00"},
        content_type="application/json",
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["cron"], body["run_at"], body["next_run_at"]) == (
        "",
        "2026-03-02T09:00:00Z",
        "2026-03-02T09:00:00Z",
    )
    assert Task.objects.get().run_at == T0


# -- active windows -----------------------------------------------------------------


def test_a_task_fires_only_inside_its_window(clock):
    starts, ends = T0 + timedelta(minutes=3), T0 + timedelta(minutes=5)
    task = scheduler.register(definition(starts_at=starts, ends_at=ends))
    assert task.next_run_at == starts
    assert scheduler.next_runs("report") == [starts, starts + MINUTE]
    runner = inline_runner(clock)
    for minute in range(0, 8):
        clock.set(T0 + minute * MINUTE)
        runner.tick()
        runner.tick()
    fired = sorted(Execution.objects.values_list("scheduled_for", flat=True))
    assert fired == [starts, starts + MINUTE]
    assert Task.objects.get().next_run_at is None


@pytest.mark.parametrize("policy", ["coalesce", "run_all"])
def test_a_runner_catching_up_late_creates_nothing_outside_the_window(clock, policy):
    """One tick long after the window: only its fire times (starts_at included, ends_at not) are
    caught up, run all or merged into one run."""
    starts, ends = T0 + 3 * MINUTE, T0 + 6 * MINUTE
    scheduler.register(
        definition(starts_at=starts, ends_at=ends, misfire_grace_seconds=3600, misfire_policy=policy)
    )
    clock.set(T0 + 20 * MINUTE)
    scheduling.schedule_due(clock.now(), "node-a")
    runs = Execution.objects.order_by("scheduled_for")
    if policy == "run_all":
        assert [row.scheduled_for for row in runs] == [starts, starts + MINUTE, starts + 2 * MINUTE]
    else:
        (run,) = runs
        assert run.scheduled_for == starts + 2 * MINUTE
        assert run.missed_fire_times["listed"] == ["2026-03-02T09:03:00Z", "2026-03-02T09:04:00Z"]
    assert Task.objects.get().next_run_at is None


def test_a_window_that_ends_before_it_starts_is_refused():
    with pytest.raises(InvalidDefinition) as raised:
        scheduler.register(definition(starts_at=T0, ends_at=T0))
    assert list(raised.value.errors) == ["ends_at"]


def test_a_cron_task_becomes_a_one_shot_from_python_rest_and_the_admin_form(clock, admin_client):
    later = T0 + timedelta(hours=2)
    for task_id in ("python", "rest", "admin"):
        scheduler.register(definition(task_id))
    scheduler.update_task("python", cron=None, run_at=later)
    client = APIClient()
    client.force_authenticate(User.objects.get(username="admin"))
    patched = client.patch(
        "/api/scheduler/tasks/rest/", {"cron": None, "run_at": later.isoformat()}, format="json"
    )
    assert patched.status_code == 200, patched.content
    url = reverse("admin:scheduler_app_task_change", args=["admin"])
    posted = task_form(Task.objects.get(id="admin"), cron="", run_at_0="2026-03-02", run_at_1="11:00:00")
    saved = admin_client.post(url, posted)
    assert saved.status_code == 302, saved.context["adminform"].form.errors
    for task in Task.objects.order_by("id"):
        assert (task.cron, task.run_at, task.next_run_at) == ("", later, later), task.id


def test_a_one_shot_outside_its_window_is_refused_and_nothing_is_written(clock):
    before, after = T0 + timedelta(hours=1), T0 + timedelta(hours=2)
    with pytest.raises(InvalidDefinition) as early:
        scheduler.register(definition(cron=None, run_at=before, starts_at=after))
    assert early.value.errors == {"run_at": ["Must be at or after starts_at: it would never fire."]}
    with pytest.raises(InvalidDefinition) as late:
        scheduler.register(definition(cron=None, run_at=after, ends_at=after))
    assert late.value.errors == {"run_at": ["Must be before ends_at: it would never fire."]}
    assert not Task.objects.exists()
    scheduler.register(definition(cron=None, run_at=after, starts_at=after, ends_at=after + MINUTE))
    with pytest.raises(InvalidDefinition) as moved:
        scheduler.update_task("report", run_at=after + MINUTE)
    assert list(moved.value.errors) == ["run_at"]
    assert Task.objects.get().run_at == after


def test_a_window_with_no_fire_time_is_refused_naming_it(clock):
    # New Year's midnight in Berlin, and a window from March to June.
    march, june = datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 6, 1, tzinfo=UTC)
    with pytest.raises(InvalidDefinition) as raised:
        scheduler.register(
            definition(cron="0 0 1 1 *", timezone="Europe/Berlin", starts_at=march, ends_at=june)
        )
    assert raised.value.errors == {
        "ends_at": [
            "The window from starts_at until ends_at holds no fire time of the cron expression "
            "(2026-03-01T00:00:00Z to 2026-06-01T00:00:00Z, in Europe/Berlin): it would never fire."
        ]
    }
    # One fire time at its last instant is enough; ends_at alone may end a task's runs.
    task = scheduler.register(definition(cron="0 0 1 6 *", starts_at=march, ends_at=june + MINUTE))
    assert task.next_run_at == june
    scheduler.update_task("report", cron="0 0 1 1 *", starts_at=None)
    with pytest.raises(InvalidDefinition):
        scheduler.update_task("report", starts_at=march)
    assert Task.objects.get().starts_at is None


def test_a_pending_occurrence_outside_a_new_window_is_interrupted_at_claim(clock):
    scheduler.register(definition())
    clock.set(T0 + MINUTE)
    scheduling.schedule_due(clock.now(), "node-a")
    scheduler.update_task("report", starts_at=T0 + timedelta(hours=1))
    claimed, _, _ = claims.claim(clock.now(), "node-a", 10, 30)
    assert not claimed
    assert Execution.objects.get().status == Status.INTERRUPTED
    assert Task.objects.get().next_run_at == T0 + timedelta(hours=1)


# -- jitter -----------------------------------------------------------------------------


def test_jitter_shifts_each_due_time_by_an_offset_taken_from_the_occurrence_id(clock):
    for n in range(20):
        scheduler.register(definition(f"hourly-{n}", cron="0 * * * *", jitter_seconds=600))
    fire = T0 + timedelta(hours=1)
    scheduling.schedule_due(fire, "node-a")
    rows = list(Execution.objects.all())
    assert len(rows) == 20
    offsets = {row.due_at - row.scheduled_for for row in rows}
    for row in rows:
        assert row.scheduled_for == fire
        assert row.occurrence_id == scheduled_occurrence_id(row.task_id, fire)
        assert row.due_at - fire == timedelta(milliseconds=row.occurrence_id.int % 600_000)
    assert len(offsets) == 20 and all(timedelta(0) <= o < timedelta(seconds=600) for o in offsets)


def test_a_jittered_occurrence_is_not_claimed_before_its_due_time(clock):
    scheduler.register(definition(cron="0 * * * *", jitter_seconds=600))
    scheduling.schedule_due(T0 + timedelta(hours=1), "node-a")
    execution = Execution.objects.get()
    assert not claims.claim(execution.due_at - timedelta(milliseconds=1), "node-a", 10, 30)[0]
    assert len(claims.claim(execution.due_at, "node-a", 10, 30)[0]) == 1


def test_jitter_must_be_shorter_than_the_shortest_interval_daylight_saving_time_included():
    scheduler.register(definition("five", cron="*/5 * * * *", jitter_seconds=299))
    with pytest.raises(InvalidDefinition) as raised:
        scheduler.register(definition("five-too-long", cron="*/5 * * * *", jitter_seconds=300))
    assert "300 s" in raised.value.errors["jitter_seconds"][0]
    # 01:30 and 02:30 are an hour apart, but on the night the clocks spring forward 02:30 does
    # not exist and fires at 03:00, half an hour after 01:30.
    scheduler.register(definition("utc", cron="30 1,2 * * *", jitter_seconds=2000))
    with pytest.raises(InvalidDefinition):
        scheduler.register(
            definition("new-york", cron="30 1,2 * * *", timezone="America/New_York", jitter_seconds=2000)
        )
    scheduler.register(one_shot(T0, id="once", jitter_seconds=86400))
    assert set(Task.objects.values_list("id", flat=True)) == {"five", "utc", "once"}


def test_the_jitter_bound_sees_intervals_that_come_once_in_years():
    # Every Monday or the 29th of February: a week apart, except in 2028, when Monday the 28th
    # and Tuesday the 29th of February are a day apart.
    scheduler.register(definition("leap", cron="0 0 29 2 1", jitter_seconds=86399))
    with pytest.raises(InvalidDefinition) as raised:
        scheduler.register(definition("leap-too-long", cron="0 0 29 2 1", jitter_seconds=86400))
    assert "86400 s" in raised.value.errors["jitter_seconds"][0]
    # The 31st of December or a Monday: a day apart in the years the 30th is a Monday.
    with pytest.raises(InvalidDefinition):
        scheduler.register(definition("new-year", cron="0 0 31 12 1", jitter_seconds=86400))
    assert set(Task.objects.values_list("id", flat=True)) == {"leap"}


def test_a_one_shot_tasks_jitter_shifts_its_one_due_time(clock):
    scheduler.register(one_shot(T0 + MINUTE, id="once", jitter_seconds=3600))
    scheduling.schedule_due(T0 + MINUTE, "node-a")
    execution = Execution.objects.get()
    assert execution.scheduled_for == T0 + MINUTE
    assert execution.due_at - execution.scheduled_for == schedule.jitter(3600, execution.occurrence_id)


def test_the_misfire_grace_counts_from_the_shifted_due_time(clock):
    def offset(task_id: str) -> timedelta:
        return schedule.jitter(50, scheduled_occurrence_id(task_id, T0 + MINUTE))

    ids = [f"t{n}" for n in range(200)]
    early = next(i for i in ids if offset(i) < timedelta(seconds=30))
    late = next(i for i in ids if offset(i) > timedelta(seconds=45))
    for task_id in (early, late):
        scheduler.register(definition(task_id, cron="1 9 * * *", jitter_seconds=50, misfire_grace_seconds=60))
    # 100 s after the fire time: due times before 40 s past it are past the grace.
    now = T0 + MINUTE + timedelta(seconds=100)
    scheduling.schedule_due(now, "node-a")
    assert Execution.objects.get(task_id=early).error["reason"] == "misfire"
    assert Execution.objects.get(task_id=late).status == Status.PENDING


# -- misfires -------------------------------------------------------------------------


def test_coalescing_records_the_merged_fire_times_on_the_run_and_the_skipped_on_the_record(clock):
    scheduler.register(definition(misfire_grace_seconds=300))
    now = T0 + timedelta(minutes=10, seconds=30)
    created, _ = scheduling.schedule_due(now, "node-a")
    run = Execution.objects.get(status=Status.PENDING)
    assert run.scheduled_for == T0 + timedelta(minutes=10)
    assert run.missed_fire_times == {
        "count": 4,
        "first": "2026-03-02T09:06:00Z",
        "last": "2026-03-02T09:09:00Z",
        "listed": [f"2026-03-02T09:0{m}:00Z" for m in (6, 7, 8, 9)],
    }
    assert [reason for _, _, reason in created][-1] == "scheduled, merging 4 missed fire times"
    record = Execution.objects.get(status=Status.INTERRUPTED)
    assert record.occurrence_id == missed_occurrence_id("report", T0 + MINUTE)
    assert record.missed_fire_times["count"] == 5
    assert (record.missed_fire_times["first"], record.missed_fire_times["last"]) == (
        "2026-03-02T09:01:00Z",
        "2026-03-02T09:05:00Z",
    )
    # Each skipped fire time's own occurrence id is free for a backfill.
    skipped_ids = [scheduled_occurrence_id("report", T0 + m * MINUTE) for m in range(1, 6)]
    assert not Execution.objects.filter(occurrence_id__in=skipped_ids).exists()


def test_a_long_skipped_span_is_counted_whole_and_listed_up_to_the_cap(clock):
    scheduler.register(definition())
    scheduling.schedule_due(T0 + timedelta(days=3), "node-a")
    record = Execution.objects.get(status=Status.INTERRUPTED)
    assert record.missed_fire_times["count"] == 3 * 1440 - 2
    assert len(record.missed_fire_times["listed"]) == scheduling.MAX_LISTED
    assert record.missed_fire_times["last"] == "2026-03-05T08:58:00Z"


def test_run_all_runs_every_fire_time_within_the_grace_in_order(clock):
    scheduler.register(definition(misfire_grace_seconds=300, misfire_policy="run_all"))
    runner = inline_runner(clock, workers=1)
    clock.set(T0 + timedelta(minutes=10, seconds=30))
    runner.tick()
    pending = Execution.objects.exclude(status=Status.INTERRUPTED).order_by("sequence")
    fired = [row.scheduled_for for row in pending]
    assert fired == [T0 + m * MINUTE for m in range(6, 11)]
    for _ in range(10):
        runner.tick()
    started = [call.context.occurrence_id for call in hooks.CALLS]
    assert started == [str(scheduled_occurrence_id("report", T0 + m * MINUTE)) for m in range(6, 11)]
    assert Execution.objects.get(status=Status.INTERRUPTED).missed_fire_times["count"] == 5


def test_run_all_caps_a_catch_up_and_records_the_rest_as_skipped(clock):
    scheduler.register(definition(misfire_grace_seconds=86400, misfire_policy="run_all"))
    now = T0 + timedelta(minutes=150)
    scheduling.schedule_due(now, "node-a")
    runs = Execution.objects.filter(status=Status.PENDING)
    assert runs.count() == scheduling.MAX_CATCH_UP
    assert min(runs.values_list("scheduled_for", flat=True)) == now - (scheduling.MAX_CATCH_UP - 1) * MINUTE
    record = Execution.objects.get(status=Status.INTERRUPTED)
    assert record.missed_fire_times["count"] == 150 - scheduling.MAX_CATCH_UP
    assert record.missed_fire_times["last"] == "2026-03-02T09:50:00Z"


def test_a_run_all_catch_up_on_a_busy_task_follows_the_overlap_policy_as_one(clock):
    scheduler.register(definition(misfire_grace_seconds=300, misfire_policy="run_all"))
    scheduler.trigger("report")
    claims.claim(T0, "node-a", 1, 600)
    scheduling.schedule_due(T0 + timedelta(minutes=3, seconds=30), "node-a")
    skipped = Execution.objects.filter(trigger_type="scheduled")
    assert sorted(row.error["reason"] for row in skipped) == ["overlap"] * 3


# -- the admin --------------------------------------------------------------------------


def test_the_admin_creates_a_one_shot_task_and_lists_it_as_once(admin_client):
    from django.urls import reverse

    from tests.factories import task_form

    response = admin_client.post(
        reverse("admin:scheduler_app_task_add"),
        task_form(cron="", run_at_0="2026-03-02", run_at_1="11:30:00", jitter_seconds=30),
    )
    assert response.status_code == 302
    task = Task.objects.get()
    assert (task.cron, task.run_at, task.jitter_seconds) == ("", T0.replace(hour=11, minute=30), 30)
    page = admin_client.get(reverse("admin:scheduler_app_task_changelist")).content.decode()
    assert "once" in page and "2026-03-02 11:30:00 UTC" in page


def test_the_admin_shows_the_fire_times_an_execution_merged(admin_client, clock):
    from django.urls import reverse

    scheduler.register(definition(misfire_grace_seconds=300))
    scheduling.schedule_due(T0 + timedelta(minutes=10, seconds=30), "node-a")
    run = Execution.objects.get(status=Status.PENDING)
    page = admin_client.get(reverse("admin:scheduler_app_execution_change", args=[run.pk])).content.decode()
    assert "4 merged from 2026-03-02T09:06:00Z to 2026-03-02T09:09:00Z" in page
    record = Execution.objects.get(status=Status.INTERRUPTED)
    page = admin_client.get(
        reverse("admin:scheduler_app_execution_change", args=[record.pk])
    ).content.decode()
    assert "5 skipped (misfire) from 2026-03-02T09:01:00Z" in page


def test_the_admin_shows_each_next_fire_times_due_time_and_which_a_pause_skips(admin_client, clock):
    from django.urls import reverse

    scheduler.register(definition("spread", cron="0 * * * *", jitter_seconds=600))
    scheduler.register(definition("paused", cron="0 * * * *"))
    scheduler.pause("paused", reason="maintenance", until=T0 + timedelta(hours=2, minutes=30))

    def preview(task_id: str) -> str:
        page = admin_client.get(reverse("admin:scheduler_app_task_change", args=[task_id])).content.decode()
        field = page[page.index("field-next_fire_times") :]
        return field[: field.index("</ol>")]

    fire = T0 + timedelta(hours=1)
    due = fire + schedule.jitter(600, scheduled_occurrence_id("spread", fire))
    shown = f"2026-03-02 10:00 UTC<br><small>due {due:%Y-%m-%d %H:%M:%S} UTC (jitter)</small>"
    assert shown in preview("spread")
    # 10:00 and 11:00 fall in the pause; it ends at 11:30, so 12:00 runs.
    items = preview("paused").split("<li>")[1:]
    assert ["paused: does not run" in item for item in items] == [True, True, False, False, False]


def test_the_admin_shows_a_tasks_window_and_jitter_and_says_when_no_fire_time_is_left(admin_client, clock):
    from django.urls import reverse

    starts, ends = T0 + 3 * MINUTE, T0 + 5 * MINUTE
    scheduler.register(definition("windowed", starts_at=starts, ends_at=ends, jitter_seconds=20))
    scheduler.register(one_shot(T0 + MINUTE, id="once"))
    listed = admin_client.get(reverse("admin:scheduler_app_task_changelist")).content.decode()
    window = re.search(r"from (.*?) until (.*?)</small>", listed)
    assert window is not None
    assert ["2026-03-02 09:03:00 UTC" in window[1], "2026-03-02 09:05:00 UTC" in window[2]] == [True, True]
    assert "jitter up to 20 s" in listed

    def preview(task_id: str) -> str:
        page = admin_client.get(reverse("admin:scheduler_app_task_change", args=[task_id])).content.decode()
        field = page[page.index("field-next_fire_times") :]
        return field[: field.index("</div>")]

    assert preview("windowed").count("<li>") == 2
    clock.set(T0 + 10 * MINUTE)
    scheduling.schedule_due(clock.now(), "node-a")
    for task_id in ("windowed", "once"):
        assert "none left: its run at time has passed or its window has ended" in preview(task_id)
