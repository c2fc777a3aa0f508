"""The operator's flows in a real browser: Playwright driving Debian's headless Chromium.

Screenshots of each flow's last page go to tests/artifacts/ (git-ignored).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.utils import timezone

from scheduler_app import scheduler
from scheduler_app.models import Execution, ExecutionLog
from tests.factories import definition
from tests.test_admin import log_row, make_execution

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-quic",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).parent / "artifacts"
BACKEND = os.environ.get("SCHEDULER_TEST_DB", "sqlite")

playwright_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (extra: browser)"
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    ),
    pytest.mark.skipif(BACKEND == "mysql", reason="browser flows run on SQLite and PostgreSQL only"),
]


@pytest.fixture
def browser_page(live_server: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A logged-in admin page in headless Chromium, against the live test server."""
    # Playwright's sync API keeps an event loop in this thread; the ORM calls of the test are still synchronous.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    User.objects.create_superuser("admin", password="admin-pw")
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(15_000)
        page.goto(f"{live_server.url}/admin/login/?next=/admin/scheduler_app/")
        page.fill("#id_username", "admin")
        page.fill("#id_password", "admin-pw")
        page.click("input[type=submit]")
        page.wait_for_url("**/admin/scheduler_app/")
        try:
            yield Browsed(page, live_server.url)
        finally:
            browser.close()
            # Django keeps a connection per context, and the ORM calls made inside Playwright's
            # sync API ran in its own: close those here, where they are seen, or their database
            # session outlives the test.
            connections.close_all()


class Browsed:
    """The page and the live server's address."""

    def __init__(self, page: Any, url: str) -> None:
        self.page = page
        self.url = url

    def go(self, path: str) -> None:
        self.page.goto(f"{self.url}{path}")


def screenshot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}-{BACKEND}.png"), full_page=True)


def run_action(page: Any, action: str, *values: str) -> None:
    """Tick the rows and run an action from a change list, as an operator does."""
    for value in values:
        page.check(f"input.action-select[value='{value}']")
    page.select_option("select[name=action]", action)
    page.click("button[name=index]")


def test_an_operator_resolves_an_unknown_execution_through_the_confirmation_page(browser_page):
    browser, page = browser_page, browser_page.page
    execution = make_execution("report", "unknown")
    browser.go("/admin/scheduler_app/")
    unknown_box = page.locator("#scheduler-unknown")
    playwright_api.expect(unknown_box).to_contain_text("1 unknown")
    screenshot(page, "dashboard")
    unknown_box.click()
    playwright_api.expect(page.locator("#result_list")).to_contain_text(str(execution.occurrence_id))
    run_action(page, "resolve_as_success", str(execution.pk))
    playwright_api.expect(page.locator("h1")).to_contain_text("Resolve unknown executions as success?")
    playwright_api.expect(page.locator(f"#evidence-{execution.pk}")).to_contain_text(
        "lease expired while running; outcome unknown"
    )
    screenshot(page, "resolve-confirmation")
    page.click("input[type=submit][value='Yes, resolve 1 as success']")
    playwright_api.expect(page.locator("ul.messagelist")).to_contain_text(
        "Resolved 1 unknown execution as success"
    )
    browser.go(f"/admin/scheduler_app/execution/{execution.pk}/change/")
    playwright_api.expect(page.locator("body")).to_contain_text("resolved as success by admin")
    screenshot(page, "resolve-unknown")
    assert Execution.objects.get(pk=execution.pk).status == "success"


def test_an_operator_repairs_logs(browser_page):
    browser, page = browser_page, browser_page.page
    execution = make_execution("report", "success", log_persistence="pending")
    browser.go("/admin/scheduler_app/")
    repair_box = page.locator("#scheduler-log-failures")
    playwright_api.expect(repair_box).to_contain_text("1 with logs to repair")
    repair_box.click()
    run_action(page, "repair_logs", str(execution.pk))
    playwright_api.expect(page.locator("ul.messagelist")).to_contain_text(
        "Rebuilt the log rows of 1 execution"
    )
    browser.go("/admin/scheduler_app/executionlog/?task_id=report")
    playwright_api.expect(page.locator("#result_list")).to_contain_text(str(execution.occurrence_id))
    playwright_api.expect(page.locator("#result_list")).to_contain_text("Success")
    screenshot(page, "repair-logs")
    assert ExecutionLog.objects.get().occurrence_id == execution.occurrence_id


def test_an_operator_runs_a_task_now_and_sees_its_execution(browser_page):
    browser, page = browser_page, browser_page.page
    scheduler.register(definition("report", cron="0 2 * * *", timezone="Europe/Berlin"))
    browser.go("/admin/scheduler_app/task/")
    playwright_api.expect(page.locator("#result_list")).to_contain_text("at 02:00 every day")
    run_action(page, "run_now", "report")
    playwright_api.expect(page.locator("ul.messagelist")).to_contain_text("Triggered 1 task")
    browser.go("/admin/scheduler_app/execution/?trigger_type__exact=manual")
    playwright_api.expect(page.locator("#result_list")).to_contain_text("manual by admin")
    screenshot(page, "run-now")
    assert Execution.objects.get().trigger_source == "admin"


def test_the_operator_on_call_sees_health_recent_runs_charts_and_history(browser_page):
    browser, page = browser_page, browser_page.page
    scheduler.register(definition("report", cron="0 2 * * *"))
    scheduler.register(definition("sweep", cron="*/5 * * * *"))
    scheduler.update_task("sweep", name="Sweep the cache")
    unknown = make_execution("report", "unknown")
    make_execution("sweep", "failed", finished_at=timezone.now())
    for status in ("success", "success", "failed"):
        log_row("sweep", status, timezone.now() - timedelta(minutes=5))
    browser.go("/admin/scheduler_app/task/")
    rows = page.locator("#result_list")
    playwright_api.expect(rows.locator("tr", has_text="report").locator(".scheduler-health")).to_have_text(
        "unknown"
    )
    playwright_api.expect(rows.locator("tr", has_text="sweep").locator(".scheduler-health")).to_have_text(
        "failing"
    )
    playwright_api.expect(rows.locator("svg.scheduler-runs rect")).to_have_count(3)
    screenshot(page, "task-list-health")
    browser.go("/admin/scheduler_app/")
    playwright_api.expect(page.locator("#scheduler-unknown-list")).to_contain_text(str(unknown.occurrence_id))
    playwright_api.expect(page.locator("#scheduler-lag-chart polyline")).to_have_count(2)
    playwright_api.expect(page.locator("#scheduler-runs-chart rect[fill='#c62828']")).to_have_count(1)
    screenshot(page, "dashboard-charts")
    browser.go("/admin/scheduler_app/task/sweep/history/")
    playwright_api.expect(page.locator("table.scheduler-changes")).to_contain_text("Sweep the cache")
    screenshot(page, "task-history")
