"""The schema's browsable page at schema/docs/: Swagger UI served whole by the project, offline."""

from __future__ import annotations

import importlib.util
import os
import re
import types
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import pytest
from django.contrib.auth.models import User
from django.test import override_settings
from django.urls import include, path
from rest_framework.test import APIClient

from scheduler_app import scheduler
from scheduler_app.api import schema as api_schema
from scheduler_app.models import Execution
from tests.factories import definition

pytest.importorskip("drf_spectacular_sidecar", reason="the docs page needs the openapi extra")

pytestmark = pytest.mark.django_db

PAGE = "/api/scheduler/schema/docs/"
SCHEMA = "/api/scheduler/schema/"
CHROMIUM = "/usr/bin/chromium"
EXTERNAL = re.compile(r"(?:https?:)?//", re.IGNORECASE)


class References(HTMLParser):
    """Every URL a page makes the browser load: src and href attributes, and data-*-url ones."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is not None and (name in ("src", "href") or name.endswith("-url")):
                self.urls.append(value)


def references(html: str) -> list[str]:
    parser = References()
    parser.feed(html)
    return parser.urls


def css_references(css: str) -> list[str]:
    """The url(...) values and the source map a stylesheet names."""
    urls = [match.strip("'\"") for match in re.findall(r"url\(\s*(\"[^\"]*\"|'[^']*'|[^)]*)\)", css)]
    urls += re.findall(r"sourceMappingURL=([^\s*]+)", css)
    return urls


def staff_client(name: str = "staff", **flags: bool) -> APIClient:
    client = APIClient()
    client.force_login(User.objects.create_user(name, password="pw", is_staff=True, **flags))
    return client


def test_the_page_and_every_file_it_names_are_served_by_the_project():
    client = staff_client()
    page = client.get(PAGE)
    assert page.status_code == 200 and page["Content-Type"].startswith("text/html")
    html = page.content.decode()
    assert "http://" not in html and "https://" not in html
    assert "default-src 'none'" in page["Content-Security-Policy"]
    urls = references(html)
    assert len(urls) == 5, urls  # stylesheet, icon, bundle, start-up script, schema
    for url in urls:
        assert not EXTERNAL.match(url) and url.startswith("/api/scheduler/schema/"), url
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
        body = b"".join(response.streaming_content) if response.streaming else response.content
        if url.split("?")[0].endswith(".css"):
            for inner in css_references(body.decode()):
                assert inner.startswith("data:") or not urlsplit(inner).scheme, inner
                if not inner.startswith("data:"):
                    assert client.get(urljoin(url, inner)).status_code == 200, inner
        if url.split("?")[0].endswith("init.js"):
            assert not re.search(r"https?://", body.decode()), body
            # Swagger UI would show a badge loaded from validator.swagger.io.
            assert b"validatorUrl: null" in body
    assert client.get(SCHEMA).status_code == 200


def test_the_page_and_its_files_take_the_schema_permissions():
    files = [PAGE, PAGE + "swagger-ui-bundle.js", PAGE + "init.js", SCHEMA]
    anonymous = APIClient()
    for url in files:
        assert anonymous.get(url).json()["code"] == "not_authenticated", url
    outsider = APIClient()
    outsider.force_login(User.objects.create_user("outsider", password="pw"))
    for url in files:
        response = outsider.get(url)
        assert response.status_code == 403 and response.json()["code"] == "permission_denied", url
    staff = staff_client()
    assert [staff.get(url).status_code for url in files] == [200, 200, 200, 200]


def test_a_file_the_page_does_not_name_is_not_served():
    client = staff_client()
    for name in ("LICENSE", "swagger-ui-standalone-preset.js", "oauth2-redirect.html", "..", "nope.js"):
        response = client.get(PAGE + name)
        assert response.status_code == 404 and response.json()["code"] == "not_found", name


def load_api_urls(monkeypatch: pytest.MonkeyPatch, **flags: bool) -> types.ModuleType:
    """A host urlconf mounting a fresh copy of scheduler_app.api.urls, as if drf-spectacular or the sidecar were missing."""
    for name, value in flags.items():
        monkeypatch.setattr(api_schema, name, value)
    spec = importlib.util.find_spec("scheduler_app.api.urls")
    assert spec is not None and spec.origin is not None
    copy_spec = importlib.util.spec_from_file_location("tests._api_urls_copy", spec.origin)
    assert copy_spec is not None and copy_spec.loader is not None
    api_urls = importlib.util.module_from_spec(copy_spec)
    copy_spec.loader.exec_module(api_urls)
    host = types.ModuleType("tests._host_urls")
    host.urlpatterns = [path("api/scheduler/", include(api_urls))]  # type: ignore[attr-defined]
    return host


@pytest.mark.parametrize(
    ("missing", "paths"),
    [("HAS_SIDECAR", [PAGE]), ("HAS_SPECTACULAR", [PAGE, SCHEMA])],
)
def test_without_the_openapi_extra_the_pages_say_what_to_install(monkeypatch, missing, paths):
    flags = (
        {"HAS_SIDECAR": False, "HAS_SPECTACULAR": False} if missing == "HAS_SPECTACULAR" else {missing: False}
    )
    host = load_api_urls(monkeypatch, **flags)
    client = staff_client()
    with override_settings(ROOT_URLCONF=host):
        for url in paths:
            response = client.get(url)
            assert response.status_code == 404, url
            body = response.json()
            assert body["code"] == "not_found"
            assert (
                'pip install "django-scheduler-app[openapi]"' in body["message"]
                and "restart" in body["message"]
            )
        assert client.get("/api/scheduler/tasks/").status_code in (200, 403)


# -- in a browser ---------------------------------------------------------------------


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"no Chromium at {CHROMIUM}")
def test_swagger_ui_renders_offline_and_its_try_it_out_triggers_a_task(live_server, monkeypatch, settings):
    """Every request the page makes goes to the project; "Try it out" sends the CSRF token."""
    playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django.middleware.csrf.CsrfViewMiddleware"]
    User.objects.create_superuser("admin", password="admin-pw")
    scheduler.register(definition("report", cron="0 0 1 1 *"))
    requested: list[str] = []
    problems: list[str] = []
    refused: list[str] = []
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            page = browser.new_page()
            page.set_default_timeout(15_000)
            page.goto(f"{live_server.url}/admin/login/?next={PAGE}")
            page.fill("#id_username", "admin")
            page.fill("#id_password", "admin-pw")
            page.on("request", lambda request: requested.append(request.url))
            page.on(
                "console", lambda message: problems.append(message.text) if message.type == "error" else None
            )
            page.on("pageerror", lambda error: problems.append(str(error)))
            page.on(
                "response", lambda response: refused.append(response.url) if response.status >= 400 else None
            )
            page.click("input[type=submit]")
            page.wait_for_url(f"**{PAGE}")
            operations = page.locator(".opblock")
            playwright_api.expect(operations).to_have_count(22)
            trigger = page.locator(".opblock-post", has_text="/tasks/{id}/trigger/")
            trigger.locator(".opblock-summary").click()
            trigger.locator("button.try-out__btn").click()
            trigger.locator("input[placeholder='id']").fill("report")
            trigger.locator("textarea.body-param__text").fill('{"source": "swagger"}')
            trigger.locator("button.execute").click()
            playwright_api.expect(
                trigger.locator(".live-responses-table tbody .response-col_status")
            ).to_contain_text("202")
        finally:
            browser.close()
    assert Execution.objects.get().trigger_source == "swagger"
    outside = [url for url in requested if not url.startswith(live_server.url)]
    assert requested and not outside, outside
    # Chromium asks for /favicon.ico on its own, when it gets to it, and the test project has none:
    # the console's "Failed to load resource" names no URL, the responses do.
    assert [url for url in refused if urlsplit(url).path != "/favicon.ico"] == []
    answered = "Failed to load resource: the server responded with a status of"
    assert [p for p in problems if not p.startswith(answered)] == []
