"""The admin for the operator on call: the task list's health, last outcome and recent runs."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from scheduler_app import scheduler
from scheduler_app.admin import task_health
from scheduler_app.admin.task_health import HEALTHS, RECENT_RUNS
from scheduler_app.models import Execution, ExecutionLog, Task, log_id
from tests.factories import definition
from tests.test_admin import make_execution

pytestmark = pytest.mark.django_db

TASKS = reverse("admin:scheduler_app_task_changelist")


def logs(task_id: str, *statuses: str) -> None:
    """One log row per status, a minute apart, the last one newest."""
    start = timezone.now() - timedelta(hours=1)
    for index, status in enumerate(statuses):
        occurrence = uuid.uuid4()
        ExecutionLog.objects.create(
            id=uuid.uuid5(occurrence, "1"),
            occurrence_id=occurrence,
            task_id=task_id,
            trigger_type="scheduled",
            status=status,
            attempt=1,
            started_at=start + timedelta(minutes=index),
            finished_at=start + timedelta(minutes=index, seconds=2),
            duration_ms=2000,
        )


def test_each_task_shows_its_health_worst_first_and_the_list_filters_on_it(admin_client):
    for task_id in ("fine", "broken", "stuck", "behind", "paused", "busy", "paused-failing"):
        scheduler.register(definition(task_id))
    make_execution("fine", "success")
    make_execution("broken", "success")
    make_execution("broken", "failed")  # the newest outcome counts
    make_execution("stuck", "failed")
    make_execution("stuck", "unknown")  # unknown outranks failing
    Task.objects.filter(id="behind").update(next_run_at=timezone.now() - timedelta(hours=2))
    scheduler.update_task("paused", enabled=False)
    make_execution("busy", "running")
    scheduler.update_task("paused-failing", enabled=False)
    make_execution("paused-failing", "failed")
    response = admin_client.get(TASKS)
    health = {task.id: task.health for task in response.context["cl"].result_list}
    assert health == {
        "fine": "ok",
        "broken": "failing",
        "stuck": "unknown",
        "behind": "late",
        "paused": "paused",
        "busy": "running",
        "paused-failing": "failing",
    }
    assert 'class="scheduler-health"' in response.content.decode()
    for wanted in set(health.values()):
        listed = admin_client.get(TASKS, {"health": wanted}).context["cl"].result_list
        assert sorted(task.id for task in listed) == sorted(t for t, h in health.items() if h == wanted), (
            wanted
        )
    ordered = admin_client.get(TASKS, {"o": "2"})  # the health column: the worst first
    assert [task.health for task in ordered.context["cl"].result_list] == sorted(
        health.values(), key=HEALTHS.index
    )


def test_late_follows_each_tasks_own_misfire_grace_in_the_list_and_its_filter(admin_client):
    scheduler.register(definition("patient", misfire_grace_seconds=3600))
    scheduler.register(definition("strict", misfire_grace_seconds=10))
    scheduler.register(definition("waiting", misfire_grace_seconds=10))
    scheduler.register(definition("default"))  # the setting's 60 s
    Task.objects.exclude(id="waiting").update(next_run_at=timezone.now() - timedelta(minutes=2))
    waiting = make_execution("waiting", "pending", attempt=0)
    Execution.objects.filter(sequence=waiting.sequence).update(due_at=timezone.now() - timedelta(seconds=30))
    health = {task.id: task.health for task in admin_client.get(TASKS).context["cl"].result_list}
    assert health == {"patient": "ok", "strict": "late", "waiting": "late", "default": "late"}
    listed = admin_client.get(TASKS, {"health": "late"}).context["cl"].result_list
    assert sorted(task.id for task in listed) == ["default", "strict", "waiting"]


def test_a_failed_attempt_waiting_for_its_retry_makes_the_task_failing_with_when(admin_client):
    scheduler.register(definition("report"))
    retried = make_execution("report", "pending", attempt=1, error={"message": "boom"})
    page = admin_client.get(TASKS)
    (task,) = page.context["cl"].result_list
    assert (task.health, task.last_status, task.last_at) == ("failing", "failed", retried.updated_at)
    assert f"{retried.updated_at:%Y-%m-%d %H:%M:%S} UTC" in page.content.decode()


def test_an_idempotent_run_put_back_to_pending_by_an_expired_lease_is_not_a_failure(admin_client):
    """Its attempt has no outcome (its log row says unknown): the task is not failing, whatever an
    earlier attempt of it left in the execution's error."""
    from scheduler_app.runner import claims

    scheduler.register(definition("report", idempotent=True, retry={"max_attempts": 3}))
    make_execution("report", "success", finished_at=timezone.now() - timedelta(minutes=30))
    lost = make_execution(
        "report", "running", attempt=2, max_attempts=3, error={"message": "attempt 1 failed"}
    )
    claims.recover_expired(timezone.now(), "node-b")
    lost.refresh_from_db()
    assert (lost.status, lost.attempt, lost.error) == ("pending", 2, None)
    (task,) = admin_client.get(TASKS).context["cl"].result_list
    assert (task.health, task.last_status) == ("ok", "success")
    assert not admin_client.get(TASKS, {"health": "failing"}).context["cl"].result_list


def test_a_retry_that_runs_leaves_the_task_failing_until_it_ends(admin_client):
    scheduler.register(definition("report"))
    retry = make_execution("report", "running", attempt=2, error={"message": "boom"})
    (task,) = admin_client.get(TASKS).context["cl"].result_list
    assert (task.health, task.last_status, task.last_at) == ("failing", "failed", retry.updated_at)
    Execution.objects.filter(sequence=retry.sequence).update(status="success", finished_at=retry.updated_at)
    (task,) = admin_client.get(TASKS).context["cl"].result_list
    assert (task.health, task.last_status) == ("ok", "success")


def test_recent_runs_show_the_newest_attempts_oldest_left_with_their_outcome(admin_client):
    scheduler.register(definition("report"))
    logs("report", *(["failed"] * 5), *(["success"] * (RECENT_RUNS - 4)), "interrupted")  # 2 too many
    page = admin_client.get(TASKS).content.decode()
    (bar,) = re.findall(r'<svg class="scheduler-runs".*?</svg>', page)
    titles = re.findall(r"<title>([a-z]+), attempt 1, ended .*? after 2\.0 s</title>", bar)
    assert len(titles) == RECENT_RUNS
    assert titles[-1] == "interrupted" and titles.count("failed") == 3 and titles[0] == "failed"
    rects = re.findall(r"<rect [^>]*>", bar)
    assert rects[0] == '<rect x="0" y="0" width="6" height="14" fill="#c62828">'
    assert rects[-1] == f'<rect x="{(RECENT_RUNS - 1) * 7}" y="0" width="6" height="14" fill="#ef8f00">'


def test_each_listed_task_shows_its_own_newest_runs(admin_client):
    """The runs of every task of the page come in one statement (where the database limits each
    part of a union): each bar holds its task's newest runs only, with their times as stored."""
    for task_id in ("busy", "new", "quiet", "rare"):
        scheduler.register(definition(task_id))
    logs("busy", *(["failed"] * 3), *(["success"] * RECENT_RUNS))
    logs("quiet", "interrupted", "success")
    logs("rare", "failed")
    page = admin_client.get(TASKS).content.decode()
    bars = {}
    for row in re.findall(r"<tr>.*?</tr>", page, re.S):
        (task_id,) = re.findall(r"/task/([a-z]+)/change/", row)[:1] or [None]
        if task_id:
            bars[task_id] = re.findall(r"<title>([a-z]+), attempt 1, ended (.*?) after 2\.0 s</title>", row)
    assert [status for status, _ in bars["busy"]] == ["success"] * RECENT_RUNS
    assert [status for status, _ in bars["quiet"]] == ["interrupted", "success"]
    assert [status for status, _ in bars["rare"]] == ["failed"]
    assert bars["new"] == []
    newest = ExecutionLog.objects.filter(task_id="rare").get().finished_at
    assert bars["rare"][0][1].startswith(f"{newest:%Y-%m-%d %H:%M:%S}")
    if connection.features.supports_slicing_ordering_in_compound:
        # Django's union has the shape the page's statement is made from (else it falls back to it).
        assert task_health._one_union(["busy", "rare"], connection.alias) is not None


def test_the_recent_runs_of_a_page_cost_the_same_statements_for_3_or_30_tasks(admin_client):
    def statements(tasks: int) -> int:
        for index in range(tasks):
            if not Task.objects.filter(id=f"t{index:02d}").exists():
                scheduler.register(definition(f"t{index:02d}"))
                logs(f"t{index:02d}", "success", "failed")
        with CaptureQueriesContext(connection) as queries:
            assert admin_client.get(TASKS).status_code == 200
        return len(queries)

    few = statements(3)
    many = statements(30)
    if connection.features.supports_slicing_ordering_in_compound:
        assert many == few
    else:
        assert many == few + 27  # SQLite: one statement per listed task


# -- the dashboard ---------------------------------------------------------------

DASHBOARD = reverse("admin:app_list", args=["scheduler_app"])


def test_the_dashboard_lists_the_unknown_executions_oldest_first_with_links(admin_client):
    scheduler.register(definition("report"))
    old = make_execution("report", "unknown", updated_at=timezone.now() - timedelta(hours=2))
    new = make_execution("report", "unknown")
    page = admin_client.get(DASHBOARD).content.decode()
    table = page[page.index('id="scheduler-unknown-list"') :]
    table = table[: table.index("</table>")]
    assert table.index(str(old.occurrence_id)) < table.index(str(new.occurrence_id))
    assert reverse("admin:scheduler_app_execution_change", args=[old.pk]) in table
    assert "2 h 00 min" in table


def runner_row(node_id: str, silent_after: timedelta, **fields):
    """A runner last seen now, silent ``silent_after`` from now."""
    from scheduler_app.models import Runner

    now = timezone.now()
    return Runner.objects.create(
        node_id=node_id,
        host="h1",
        pid=1,
        started_at=now,
        last_seen_at=now,
        silent_after=now + silent_after,
        **fields,
    )


def test_the_dashboard_lists_the_runners_with_their_heartbeat(admin_client):
    runner_row("node-a", timedelta(minutes=1))
    page = admin_client.get(DASHBOARD).content.decode()
    table = page[page.index('id="scheduler-runner-list"') :]
    assert re.search(r"<td>node-a</td><td>alive</td><td>\d+ ms ago</td>", table)


def test_the_site_index_warns_when_no_runner_is_alive_to_those_who_may_see_executions(
    admin_client, client, django_user_model, django_assert_num_queries
):
    from django.contrib.auth.models import Permission

    from scheduler_app.models import Runner
    from scheduler_app.templatetags.scheduler_admin import scheduler_runner_warning

    warning = "Scheduler: no live runner, so no task is scheduled or run."
    page = admin_client.get(reverse("admin:index")).content.decode()
    assert warning in page and 'href="/admin/scheduler_app/">Its dashboard</a>' in page
    assert 'id="content-main"' in page  # the index itself is still there
    runner_row("gone", timedelta(minutes=1), stopped_at=timezone.now())
    assert warning in admin_client.get(reverse("admin:index")).content.decode()
    runner_row("node-a", timedelta(minutes=1))
    assert warning not in admin_client.get(reverse("admin:index")).content.decode()
    request = admin_client.get(reverse("admin:index")).wsgi_request
    with django_assert_num_queries(1):  # the warning's cost on the index: one statement
        scheduler_runner_warning({"request": request})
    Runner.objects.all().delete()
    staff = django_user_model.objects.create_user("staff", password="pw", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_task"))
    client.force_login(staff)
    page = client.get(reverse("admin:index")).content.decode()
    assert "Tasks" in page and warning not in page


def test_the_dashboard_draws_the_lag_p50_and_p95_of_each_hour(admin_client):
    hour = timezone.now().replace(minute=0, second=0, microsecond=0)
    for lag in range(1, 21):  # 1 s to 20 s: p50 10 s, p95 19 s
        due = hour + timedelta(minutes=lag)
        make_execution(
            "report",
            "success",
            due_at=due,
            created_at=due,
            started_at=due + timedelta(seconds=lag),
            finished_at=due + timedelta(seconds=lag + 1),
        )
    # A backfilled occurrence, due hours before it was created: its lag counts from its creation.
    make_execution(
        "report",
        "success",
        due_at=hour - timedelta(hours=20),
        created_at=hour + timedelta(minutes=30),
        started_at=hour + timedelta(minutes=30, seconds=10),
        finished_at=hour + timedelta(minutes=30, seconds=11),
    )
    page = admin_client.get(DASHBOARD).content.decode()
    chart = page[page.index('id="scheduler-lag-chart"') :]
    chart = chart[: chart.index("</svg>")]
    assert f"{hour:%Y-%m-%d %H}:00 UTC: p50 10.0 s, p95 19.0 s (21 executions)" in chart
    assert chart.count("<polyline") == 2 and "top 19.0 s" in chart


# -- detail pages: seconds, durations, links and actions ---------------------------


def test_an_execution_page_shows_seconds_durations_and_links(admin_client):
    scheduler.register(definition("report"))
    due = timezone.now().replace(microsecond=0) - timedelta(minutes=5)
    execution = make_execution(
        "report",
        "success",
        due_at=due,
        started_at=due + timedelta(seconds=2, milliseconds=500),
        finished_at=due + timedelta(seconds=14),
    )
    page = admin_client.get(
        reverse("admin:scheduler_app_execution_change", args=[execution.pk])
    ).content.decode()
    assert f"{due:%Y-%m-%d %H:%M:%S} UTC" in page
    assert f"{due + timedelta(seconds=14):%Y-%m-%d %H:%M:%S} UTC" in page
    assert "2.5 s" in page and "11.5 s" in page  # waited, then ran for
    assert reverse("admin:scheduler_app_task_change", args=["report"]) in page
    assert "?owner=node-a" in page or "?q=node-a" in page
    assert f"occurrence_id={execution.occurrence_id}" in page and "task_id=report" in page
    assert "1 min 00 s" in page  # the state history: each change's time since creation


def test_an_unknown_execution_is_resolved_from_its_own_page(admin_client):
    execution = make_execution("report", "unknown")
    page_url = reverse("admin:scheduler_app_execution_change", args=[execution.pk])
    act = reverse("admin:scheduler_app_execution_act", args=[execution.pk])
    page = admin_client.get(page_url).content.decode()
    assert 'value="resolve_as_discarded"' in page and 'value="request_stop"' not in page
    confirmation = admin_client.post(
        act, {"action": "resolve_as_discarded", "_selected_action": execution.pk}
    )
    assert b"Resolve unknown executions as discarded?" in confirmation.content
    done = admin_client.post(
        act,
        {
            "action": "resolve_as_discarded",
            "_selected_action": execution.pk,
            "post": "yes",
            f"expected_{execution.pk}": execution.updated_at.isoformat(),
        },
    )
    assert done.status_code == 302 and done["Location"] == page_url
    execution.refresh_from_db()
    assert execution.status == "discarded"


def test_a_running_execution_is_stopped_from_its_page_and_others_refuse_the_button(admin_client):
    from django.test import Client

    from tests.test_admin import staff

    running = make_execution("report", "running")
    act = reverse("admin:scheduler_app_execution_act", args=[running.pk])
    page = admin_client.get(
        reverse("admin:scheduler_app_execution_change", args=[running.pk])
    ).content.decode()
    assert 'value="request_stop"' in page and 'value="resolve_as_success"' not in page
    assert (
        admin_client.post(act, {"action": "resolve_as_success"}).status_code == 403
    )  # not for a running one
    assert admin_client.post(act, {"action": "request_stop"}).status_code == 302
    running.refresh_from_db()
    assert running.stop_requested
    viewer = Client()
    viewer.force_login(staff("val", "view_execution"))
    page = viewer.get(reverse("admin:scheduler_app_execution_change", args=[running.pk])).content.decode()
    assert 'value="request_stop"' not in page
    assert viewer.post(act, {"action": "request_stop"}).status_code == 403
    assert viewer.get(act).status_code == 405


def test_a_task_is_run_now_and_paused_from_its_own_page(admin_client):
    from scheduler_app.models import Execution, TaskChange

    scheduler.register(definition("report"))
    page_url = reverse("admin:scheduler_app_task_change", args=["report"])
    act = reverse("admin:scheduler_app_task_act", args=["report"])
    page = admin_client.get(page_url).content.decode()
    assert 'value="run_now"' in page and 'value="pause"' in page and 'value="resume"' not in page
    assert reverse("admin:scheduler_app_execution_changelist") + "?task_id=report" in page
    assert admin_client.post(act, {"action": "run_now"})["Location"] == page_url
    assert Execution.objects.get().trigger_source == "admin"
    asked = admin_client.post(act, {"action": "pause"})
    assert asked.status_code == 200 and b'name="reason"' in asked.content
    assert Task.objects.get(id="report").enabled
    done = admin_client.post(act, {"action": "pause", "post": "yes", "reason": "incident", "until": ""})
    assert done["Location"] == page_url
    assert (Task.objects.get(id="report").enabled, Task.objects.get(id="report").disabled_reason) == (
        False,
        "incident",
    )
    assert TaskChange.objects.latest("id").via == "admin"
    page = admin_client.get(page_url).content.decode()
    assert 'value="resume"' in page and "incident" in page and "Paused since" in page


def test_the_log_list_shows_seconds_durations_and_links_to_the_execution(admin_client):
    logs("report", "success")
    log = ExecutionLog.objects.get()
    page = admin_client.get(reverse("admin:scheduler_app_executionlog_changelist")).content.decode()
    assert f"{log.finished_at:%Y-%m-%d %H:%M:%S} UTC" in page and "2.0 s" in page
    assert f"?occurrence_id={log.occurrence_id}" in page
    executions = admin_client.get(
        reverse("admin:scheduler_app_execution_changelist"), {"occurrence_id": "nope"}
    )
    assert executions.status_code == 200


def test_the_log_list_of_one_occurrence_shows_each_of_its_attempts(admin_client):
    retried = make_execution("report", "failed", attempt=3, max_attempts=3)
    other = make_execution("report", "success")
    finished = timezone.now()
    for execution, attempts in ((retried, (1, 2, 3)), (other, (1,))):
        for attempt in attempts:
            ExecutionLog.objects.create(
                id=log_id(execution.occurrence_id, attempt),
                occurrence_id=execution.occurrence_id,
                task_id="report",
                trigger_type="scheduled",
                status=execution.status,
                attempt=attempt,
                finished_at=finished,
            )
    url = reverse("admin:scheduler_app_executionlog_changelist")

    def shown(occurrence_id: object) -> list[tuple[object, int]]:
        rows = admin_client.get(url, {"occurrence_id": str(occurrence_id)}).context["cl"].result_list
        return sorted((row.occurrence_id, row.attempt) for row in rows)

    assert shown(retried.occurrence_id) == [(retried.occurrence_id, n) for n in (1, 2, 3)]
    assert shown(other.occurrence_id) == [(other.occurrence_id, 1)]
    assert shown(uuid.uuid4()) == []


# -- lists of millions of rows -----------------------------------------------------


def test_the_journal_list_never_counts_every_row(admin_client, monkeypatch):
    from scheduler_app.admin.common import BoundedCountPaginator
    from scheduler_app.admin.executions import ExecutionAdmin

    monkeypatch.setattr(BoundedCountPaginator, "ahead", 3)
    monkeypatch.setattr(ExecutionAdmin, "list_per_page", 2)
    for _ in range(5):
        make_execution("report", "success")
    url = reverse("admin:scheduler_app_execution_changelist")
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(url, {"status": "success"}).content.decode()
    assert '<span class="scheduler-count">more than 3</span>' in page
    counts = [query["sql"].upper() for query in queries if "COUNT(" in query["sql"].upper()]
    assert counts and all("LIMIT 4" in sql for sql in counts), counts
    assert "Show counts" not in page  # no per-filter counts either
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE scheduler_app_execution")
        page = admin_client.get(url).content.decode()
        assert '<span class="scheduler-count">about 5</span>' in page
    else:
        assert '<span class="scheduler-count">more than 3</span>' in admin_client.get(url).content.decode()
    few = admin_client.get(url, {"status": "unknown"}).content.decode()
    assert '<span class="scheduler-count">0</span>' in few


def test_a_filtered_task_list_counts_at_most_its_limit_and_the_whole_list_exactly(admin_client, monkeypatch):
    from scheduler_app.admin.common import TaskCountPaginator
    from scheduler_app.admin.tasks import TaskAdmin

    monkeypatch.setattr(TaskCountPaginator, "ahead", 3)
    monkeypatch.setattr(TaskAdmin, "list_per_page", 2)
    for index in range(5):
        scheduler.register(definition(f"t{index}"))
        make_execution(f"t{index}", "failed")
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(TASKS, {"health": "failing"}).content.decode()
    assert '<span class="scheduler-count">more than 3</span>' in page
    (count,) = [sql.upper() for sql in statements_trying_every_task(queries)]
    assert "LIMIT 4" in count
    assert "COALESCE" not in count  # no column of the list, only what the filter needs
    assert '<span class="scheduler-count">5</span>' in admin_client.get(TASKS).content.decode()
    few = admin_client.get(TASKS, {"health": "failing", "q": "t1"}).content.decode()
    assert '<span class="scheduler-count">1</span>' in few


def statements_trying_every_task(queries: CaptureQueriesContext) -> list[str]:
    """The statements of a task list filtered on failing tasks that try tasks other than the
    page's, read by their keys."""
    task = connection.ops.quote_name("scheduler_app_task")
    by_key = f"{task}.{connection.ops.quote_name('id')} IN ("
    return [
        query["sql"]
        for query in queries
        if f"FROM {task}" in query["sql"] and "'failed'" in query["sql"] and by_key not in query["sql"]
    ]


@pytest.mark.parametrize("per_page", [100, 1])
def test_a_filtered_task_list_tries_each_task_once(admin_client, monkeypatch, per_page):
    """Each task a filter tries costs a read of its history: counted, then read as Django reads a
    page, a filter few tasks match tried every task twice. The page's tasks are read by the keys
    the count found, whether the list fits on a page or not."""
    from scheduler_app.admin.tasks import TaskAdmin

    monkeypatch.setattr(TaskAdmin, "list_per_page", per_page)
    for index in range(6):
        scheduler.register(definition(f"t{index}"))
        make_execution(f"t{index}", "failed" if index in (1, 4) else "success")
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(TASKS, {"health": "failing"})
    assert [task.id for task in response.context["cl"].result_list] == ["t1", "t4"][:per_page]
    assert [task.health for task in response.context["cl"].result_list] == ["failing"] * min(per_page, 2)
    assert len(statements_trying_every_task(queries)) == 1, statements_trying_every_task(queries)
    second = admin_client.get(TASKS, {"health": "failing", "p": 2})
    assert [task.id for task in second.context["cl"].result_list] == (
        ["t4"] if per_page == 1 else ["t1", "t4"]
    )


def test_a_bounded_count_is_counted_from_the_page_shown_so_every_page_can_be_reached(
    admin_client, monkeypatch
):
    from scheduler_app.admin.common import BoundedCountPaginator, TaskCountPaginator
    from scheduler_app.admin.executions import ExecutionAdmin
    from scheduler_app.admin.tasks import TaskAdmin

    for paginator in (TaskCountPaginator, BoundedCountPaginator):
        monkeypatch.setattr(paginator, "ahead", 2)
    for model_admin in (TaskAdmin, ExecutionAdmin):
        monkeypatch.setattr(model_admin, "list_per_page", 2)
    for index in range(7):
        scheduler.register(definition(f"t{index}"))
        make_execution(f"t{index}", "failed")
    filtered = {
        TASKS: {"health": "failing"},
        reverse("admin:scheduler_app_execution_changelist"): {"status": "failed"},
    }
    for url, query in filtered.items():
        rows, counts = [], []
        for page in (1, 2, 3, 4):
            response = admin_client.get(url, {**query, "p": page})
            assert response.status_code == 200
            rows.append([str(row.pk) for row in response.context["cl"].result_list])
            counts.append(response.content.decode().split('class="scheduler-count">', 1)[1].split("<", 1)[0])
        assert counts == ["more than 2", "more than 4", "more than 6", "7"]
        assert [len(page_rows) for page_rows in rows] == [2, 2, 2, 1]
        assert len({pk for page_rows in rows for pk in page_rows}) == 7
        # Past the last page, or deeper than a list's pages reach: Django's answer to a page that
        # does not exist, before anything is counted.
        assert admin_client.get(url, {**query, "p": 5}).status_code == 302
        assert admin_client.get(url, {**query, "p": 10**17}).status_code == 302
        # No "Show all": a bounded count is no bound on all the rows.
        everything = admin_client.get(url, {**query, "all": ""})
        assert len(everything.context["cl"].result_list) == 2
        assert not everything.context["cl"].can_show_all


@pytest.mark.parametrize(
    ("expression", "reading"),
    [
        ("@daily", "at 00:00 every day"),
        ("@weekly", "at 00:00 on Sunday"),
        ("0 0 L * *", "at 00:00 on the last day of the month"),
        ("0 0 L-3 * *", "at 00:00 on 3 days before the last day of the month"),
        ("0 9 ? * 1#2", "at 09:00 on the second Monday of the month"),
        ("0 0 15W * *", "at 00:00 on the weekday nearest day 15 of the month"),
        ("0 0 LW * *", "at 00:00 on the last weekday of the month"),
        ("0 0 * * friL", "at 00:00 on the last Friday of the month"),
        ("0 0 1 * mon-wed", "at 00:00 on day 1 of the month or on Monday to Wednesday"),
    ],
)
def test_the_task_list_reads_the_fuller_dialect(expression: str, reading: str) -> None:
    from scheduler_app.admin.crontext import describe

    assert describe(expression) == reading


def test_the_dashboard_counts_the_queue_now_and_what_ended_in_the_last_day(admin_client):
    long_ago = timezone.now() - timedelta(days=3)
    make_execution("report", "pending", updated_at=long_ago)  # still in the queue: counted
    make_execution("report", "unknown", updated_at=long_ago)
    make_execution("report", "success", finished_at=long_ago)  # ended before the day: not counted
    make_execution("report", "success", finished_at=timezone.now())
    page = admin_client.get(DASHBOARD).content.decode()
    counts = dict(
        (status, int(n)) for n, status in re.findall(r"<strong>(\d+)</strong> ([a-z]+)</a></li>", page)
    )
    assert counts == {
        "unknown": 1,
        "pending": 1,
        "claimed": 0,
        "running": 0,
        "success": 1,
        "failed": 0,
        "interrupted": 0,
        "discarded": 0,
    }


def test_run_at_asks_for_the_time_then_triggers_each_task_due_then(admin_client):
    from scheduler_app.models import Execution

    scheduler.register(definition("report"))
    scheduler.register(definition("sweep"))
    chosen = {"action": "run_at", "_selected_action": ["report", "sweep"], "index": "0"}
    day = (timezone.now() + timedelta(days=40)).date()
    form = admin_client.post(TASKS, chosen)
    assert form.status_code == 200 and b'name="run_at"' in form.content and not Execution.objects.exists()
    wrong = admin_client.post(TASKS, {**chosen, "post": "yes", "run_at": "next tuesday"})
    assert b"errorlist" in wrong.content and not Execution.objects.exists()
    # Checked as scheduler.trigger() checks it, and said on the form: not "The trigger is invalid."
    far = (timezone.now() + timedelta(days=400)).date()
    too_far = admin_client.post(TASKS, {**chosen, "post": "yes", "run_at": f"{far}T10:00:00+02:00"})
    assert too_far.context["form"].errors == {"run_at": ["Must be at most 366 days from now."]}
    assert not Execution.objects.exists()
    done = admin_client.post(TASKS, {**chosen, "post": "yes", "run_at": f"{day}T10:00:00+02:00"}, follow=True)
    assert f"Triggered 2 tasks, due {day} 08:00:00 UTC: report, sweep." in [
        str(message) for message in done.context["messages"]
    ]
    rows = Execution.objects.order_by("task_id")
    assert [(e.task_id, e.status, e.trigger_source) for e in rows] == [
        ("report", "pending", "admin"),
        ("sweep", "pending", "admin"),
    ]
    assert {e.due_at.isoformat() for e in rows} == {f"{day}T08:00:00+00:00"}


def test_ids_with_underscores_reach_their_pages_and_history(admin_client):
    from django.contrib.admin.utils import quote

    scheduler.register(definition("nightly_report_24h"))
    scheduler.update_task("nightly_report_24h", name="Renamed")
    page = admin_client.get(reverse("admin:scheduler_app_task_change", args=[quote("nightly_report_24h")]))
    history_url = reverse("admin:scheduler_app_task_history", args=[quote("nightly_report_24h")])
    assert history_url in page.content.decode()
    history = admin_client.get(history_url)
    assert history.status_code == 200 and 'class="scheduler-changes"' in history.content.decode()
    changes = admin_client.get(reverse("admin:scheduler_app_taskchange_changelist")).content.decode()
    link = reverse("admin:scheduler_app_task_change", args=[quote("nightly_report_24h")])
    assert link in changes and admin_client.get(link).status_code == 200


def test_a_zone_the_zone_database_dropped_does_not_break_the_task_pages(admin_client):
    scheduler.register(definition("report"))
    Task.objects.filter(id="report").update(timezone="Gone/Zone")
    assert admin_client.get(TASKS).status_code == 200
    assert admin_client.get(reverse("admin:scheduler_app_task_change", args=["report"])).status_code == 200


def test_an_action_button_needs_the_right_to_see_the_object_too():
    from django.test import Client

    from tests.test_admin import staff

    scheduler.register(definition("report"))
    blind = Client()
    blind.force_login(staff("bo", "add_execution"))  # may trigger, may not see tasks
    act = reverse("admin:scheduler_app_task_act", args=["report"])
    assert blind.post(act, {"action": "run_now"}).status_code == 403
    from scheduler_app.models import Execution

    assert not Execution.objects.exists()


def test_a_tasks_own_page_offers_run_at_which_asks_for_the_time_then_triggers_it(admin_client):
    from scheduler_app.models import Execution

    scheduler.register(definition("report"))
    page = admin_client.get(reverse("admin:scheduler_app_task_change", args=["report"])).content.decode()
    assert 'name="object_action" value="run_at"' in page
    act = reverse("admin:scheduler_app_task_act", args=["report"])
    asked = admin_client.post(act, {"action": "run_at", "_selected_action": "report"})
    assert asked.status_code == 200 and b'name="run_at"' in asked.content
    assert not Execution.objects.exists()
    day = (timezone.now() + timedelta(days=3)).date()
    done = admin_client.post(
        act, {"action": "run_at", "_selected_action": "report", "post": "yes", "run_at": f"{day}T10:00:00Z"}
    )
    assert done.status_code == 302
    assert [(e.task_id, e.due_at.isoformat()) for e in Execution.objects.all()] == [
        ("report", f"{day}T10:00:00+00:00")
    ]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="JIT compilation is PostgreSQL's")
@pytest.mark.django_db(transaction=True)
def test_the_lists_are_read_without_jit_compilation(admin_client):
    """PostgreSQL compiled the task list's query to machine code before running it: two seconds
    at a hundred thousand tasks, for a page read in a tenth of one."""
    scheduler.register(definition())
    make_execution("report", "failed")
    jit_settings: list[str] = []

    def note_jit(execute, sql, params, many, context):
        if sql.lstrip().upper().startswith("SELECT") and "scheduler_app_" in sql:
            with context["connection"].connection.cursor() as raw:
                raw.execute("SHOW jit")
                jit_settings.append(raw.fetchone()[0])
        return execute(sql, params, many, context)

    for model in ("task", "execution", "executionlog"):
        with connection.execute_wrapper(note_jit):
            response = admin_client.get(reverse(f"admin:scheduler_app_{model}_changelist"), {"o": "1"})
        assert response.status_code == 200
    assert jit_settings and set(jit_settings) == {"off"}
    with connection.cursor() as cursor:
        cursor.execute("SHOW jit")
        assert cursor.fetchone()[0] == "on"  # the connection's own setting is left as it was


def test_the_lists_draw_the_same_action_checkbox_as_django():
    from django.contrib import admin

    task = Task(id='a"<&b', name="x")
    for model_admin in admin.site._registry.values():
        assert model_admin.action_checkbox(task) == admin.ModelAdmin.action_checkbox(model_admin, task)
