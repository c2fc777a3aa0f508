"""Handler secrets stay with their destination and out of what is stored; hostile outcomes are stored cleanly.

Each test performs an attack against local servers on loopback: a URL that reads as one host
and connects to another, an endpoint that echoes what it receives, a response full of
characters the databases refuse.
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, quote_plus, urlsplit

import pytest
import requests
from django.contrib.auth.models import Permission, User
from django.db import DataError, connection
from django.urls import reverse
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from scheduler_app import journal, scheduler
from scheduler_app.handlers import registry
from scheduler_app.handlers.base import HandlerError
from scheduler_app.handlers.http import HttpHandler
from scheduler_app.handlers.http_network import NetworkPolicy, normalise_host
from scheduler_app.models import Execution, ExecutionEvent, ExecutionLog, Status, Task
from scheduler_app.runner import attempt
from tests.factories import definition, inline_runner, task_form
from tests.http_servers import NEVER, Server, run_direct, start, stop, use_http

TOKEN = "s3cret:token-1"
API_KEY = "k3y secret/2"
PASSWORD = "pw-secret-3"


@pytest.fixture(autouse=True)
def _allow_local_servers(settings: Any) -> None:
    use_http(settings, ALLOWED_NETWORKS=["127.0.0.0/8"])


@pytest.fixture
def attacker() -> Iterator[Server]:
    local = start(Server())
    yield local
    stop(local)


def secret_handler(server: Server, path: str = "/echo") -> dict[str, Any]:
    return {
        "kind": "api",
        "url": server.url(f"{path}?token={TOKEN}").replace("://", f"://robot:{PASSWORD}@"),
        "headers": {"X-Api-Key": API_KEY},
    }


def backslash_url(attacker: Server, victim: Server) -> str:
    """Reads as the victim to urllib.parse; requests connects to the attacker."""
    return f"http://127.0.0.1:{attacker.port}\\@127.0.0.1:{victim.port}/v1?token=***"


def connects_to(url: str) -> tuple[str, int]:
    """The host and port requests' transport connects to for ``url`` (it parses the prepared URL)."""
    parts = urlsplit(str(requests.Request("GET", url).prepare().url))
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def editor_client() -> APIClient:
    """Allowed to change tasks and what they run; like everyone, never shown the secrets."""
    user = User.objects.create_user("editor", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="scheduler_app",
            codename__in=["view_task", "change_task", "change_task_handler", "add_execution"],
        )
    )
    client = APIClient()
    client.force_authenticate(User.objects.get(pk=user.pk))
    return client


def leaked(*values: Any) -> list[str]:
    text = json.dumps(values, default=str)
    forms = [
        TOKEN,
        API_KEY,
        PASSWORD,
        *(quote(value, safe="") for value in (TOKEN, API_KEY)),
        *(quote_plus(value) for value in (TOKEN, API_KEY)),
        base64.b64encode(f"robot:{PASSWORD}".encode()).decode(),
    ]
    return [form for form in forms if form in text]


def stored(execution: Execution) -> list[Any]:
    return [
        execution.result,
        execution.error,
        list(ExecutionEvent.objects.values("reason", "result", "error")),
        list(ExecutionLog.objects.values("result", "error")),
    ]


# -- a URL that reads as one host and connects to another ------------------------------------------


@pytest.mark.django_db
def test_a_backslash_url_keeping_the_masked_secrets_is_refused_by_the_api_and_sends_nothing(
    clock, server, attacker
):
    scheduler.register(definition("report", cron=NEVER, handler=secret_handler(server)))
    client = editor_client()
    shown = client.get("/api/scheduler/tasks/report/").json()["handler"]
    assert shown["headers"] == {"X-Api-Key": "***"} and "token=***" in shown["url"]
    response = client.patch(
        "/api/scheduler/tasks/report/",
        {"handler": {**shown, "url": backslash_url(attacker, server)}},
        format="json",
    )
    assert response.status_code == 400 and response.json()["code"] == "scheduler:012"
    assert leaked(response.json()) == []
    assert Task.objects.get().handler == secret_handler(server)
    scheduler.trigger("report")
    inline_runner(clock).tick()
    assert attacker.connections == 0 and len(server.requests) == 1


@pytest.mark.django_db
def test_a_backslash_url_keeping_the_masked_secrets_is_refused_by_the_admin_form(
    admin_client, clock, server, attacker
):
    task = scheduler.register(definition("report", cron=NEVER, handler=secret_handler(server)))
    url = reverse("admin:scheduler_app_task_change", args=["report"])
    shown = admin_client.get(url).context["adminform"].form.initial["handler"]
    edited = {**shown, "url": backslash_url(attacker, server)}
    response = admin_client.post(url, task_form(task, handler=json.dumps(edited)))
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["handler"]
    assert Task.objects.get().handler == secret_handler(server)
    scheduler.trigger("report")
    inline_runner(clock).tick()
    assert attacker.connections == 0


@pytest.mark.django_db
def test_a_backslash_url_stored_before_it_was_refused_is_shown_masked_whole_and_never_called(
    clock, server, attacker
):
    handler = {**secret_handler(server), "url": backslash_url(attacker, server).replace("***", TOKEN)}
    Task.objects.create(id="legacy", name="Legacy", cron=NEVER, handler=handler)
    assert registry.masked(handler) == {**handler, "url": "***", "headers": {"X-Api-Key": "***"}}
    execution = scheduler.trigger("legacy")
    inline_runner(clock).tick()
    execution.refresh_from_db()
    assert execution.status == Status.FAILED and execution.error["code"] == "scheduler:025"
    assert attacker.connections == 0 and server.connections == 0


AUTHORITY_PARTS = [
    "127.0.0.1",
    "victim.example",
    "attacker.example",
    "localhost",
    "@",
    ":",
    "\\",
    "%5C",
    "%40",
    "%2F",
    "/",
    "?",
    "#",
    ";",
    "[",
    "]",
    "::1",
    ".",
    "%2e",
    "PORT",
    "8294",
    "0",
    "robot",
    "pw",
    "\uff20",
    "\u3002",
    "b\u00fccher",
    "%",
    "%00",
]
authorities = st.lists(st.sampled_from(AUTHORITY_PARTS), min_size=1, max_size=7).map("".join)


# Most generated authorities are refused by validate() and filtered out, on purpose: the accepted
# ones are those worth checking.
@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much],
)
@given(authority=authorities)
@example(authority="127.0.0.1:PORT")
@example(authority="[::1]")
@example(authority="[::1%5C]")
@example(authority="robot:pw@b\u00fccher.example.:PORT")
def test_every_accepted_url_is_checked_and_connected_at_the_host_its_text_shows(
    monkeypatch, server, authority
):
    """The host the checks see (the address policy, masking, the same-origin test) is the host connected."""
    url = f"http://{authority.replace('PORT', str(server.port))}/echo?token={TOKEN}"
    assume(not HttpHandler().validate({"kind": "api", "url": url}))
    resolved: list[tuple[str, int]] = []

    def resolve(policy: NetworkPolicy, host: str, port: int) -> list[Any]:
        resolved.append((host, port))
        return [(socket.AF_INET, ("127.0.0.1", server.port))]

    monkeypatch.setattr(NetworkPolicy, "resolve", resolve)
    received = len(server.requests)
    with contextlib.suppress(HandlerError):  # a path other than /echo: no such route
        run_direct(url=url)
    host, port = connects_to(url)
    assert resolved == [(host, port)]
    raw = urlsplit(url)
    if raw.hostname and raw.hostname.isascii():
        assert (raw.hostname, raw.port or 80) == (host, port)
    sent_host = server.requests[received]["headers"]["Host"]
    name = sent_host.partition("]")[0] + "]" if sent_host.startswith("[") else sent_host.partition(":")[0]
    assert normalise_host(name) == normalise_host(host)


@settings(max_examples=300, deadline=None)
@given(authority=authorities)
@example(authority="robot:***@victim.example:PORT")
@example(authority="127.0.0.1:8295\\@victim.example:PORT")
def test_stored_secrets_are_restored_only_into_a_url_that_goes_where_they_were_stored(authority):
    stored = {
        "kind": "api",
        "url": f"http://robot:{PASSWORD}@victim.example:8294/v1?token={TOKEN}",
        "headers": {"X-Api-Key": API_KEY},
    }
    submitted = {
        **registry.masked(stored),
        "url": f"http://{authority.replace('PORT', '8294')}/v1?token=***",
    }
    restored = registry.unmask(submitted, stored)
    if HttpHandler().validate(restored) or not leaked(restored):
        return
    assert connects_to(restored["url"]) == connects_to(stored["url"])


# -- secrets echoed back ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_secrets_an_endpoint_echoes_are_masked_in_the_result_events_and_logs(clock, server):
    scheduler.register(definition("report", cron=NEVER, handler=secret_handler(server)))
    execution = scheduler.trigger("report")
    inline_runner(clock).tick()
    execution.refresh_from_db()
    received = server.requests[0]
    assert received["headers"]["X-Api-Key"] == API_KEY and TOKEN in received["raw"]
    assert execution.status == Status.SUCCESS
    assert execution.result["body"]["headers"]["X-Api-Key"] == "***"
    assert execution.result["body"]["headers"]["Authorization"] == "Basic ***"
    assert leaked(stored(execution)) == []


@pytest.mark.django_db
def test_secrets_echoed_percent_encoded_or_base64_in_a_failure_or_text_are_masked(clock, server):
    scheduler.register(definition("report", cron=NEVER, handler=secret_handler(server, "/reflect/500")))
    execution = scheduler.trigger("report")
    inline_runner(clock).tick()
    execution.refresh_from_db()
    assert execution.status == Status.FAILED and execution.error["code"] == "scheduler:025"
    assert "***" in execution.error["message"]
    scheduler.update_task("report", handler=secret_handler(server, "/reflect/200"))
    second = scheduler.trigger("report")
    inline_runner(clock).tick()
    second.refresh_from_db()
    assert second.status == Status.SUCCESS and "***" in second.result["body"]
    assert leaked(stored(execution), stored(second)) == []


@pytest.mark.parametrize(
    ("before", "body"),
    [(990, "a" * 990), (995, "a" * 995), (999, "a" * 999), (980, "a" * 980 + "***" + "b" * 8)],
)
def test_a_secret_across_the_result_cut_is_cut_off_whole(settings, server, before, body):
    use_http(settings, ALLOWED_NETWORKS=["127.0.0.0/8"], RESULT_MAX_BYTES=1000)
    config = secret_handler(server, f"/pad/{before}")
    del config["kind"]
    assert run_direct(**config) == {"status": 200, "body": body, "truncated": True}


# -- hostile responses --------------------------------------------------------------------------------


HOSTILE = {"nul\u0000key": "a\u0000b", "\ud800": ["lone \udc00 surrogate", {"k\udfff": "\u0000"}]}
CLEANED = {"nul\ufffdkey": "a\ufffdb", "\ufffd": ["lone \ufffd surrogate", {"k\ufffd": "\ufffd"}]}


@pytest.mark.django_db
def test_a_response_with_nul_and_lone_surrogates_is_stored_cleaned_at_once(clock, server):
    body = json.dumps(HOSTILE)
    scheduler.register(
        definition("report", cron=NEVER, handler={"kind": "api", "url": server.url("/raw/200")})
    )
    server.next_body = body.encode()
    execution = scheduler.trigger("report")
    inline_runner(clock).tick()
    execution.refresh_from_db()
    assert execution.status == Status.SUCCESS
    assert execution.result == {"status": 200, "body": CLEANED, "truncated": False}
    assert ExecutionLog.objects.get().result == execution.result


@pytest.mark.django_db
def test_an_error_excerpt_with_nul_and_lone_surrogates_is_stored_cleaned(clock, server):
    scheduler.register(
        definition("report", cron=NEVER, handler={"kind": "api", "url": server.url("/raw/500")})
    )
    server.next_body = "bad\u0000thing \\ud800".encode() + b"\xed\xa0\x80 end"
    execution = scheduler.trigger("report")
    inline_runner(clock).tick()
    execution.refresh_from_db()
    assert execution.status == Status.FAILED
    message = execution.error["message"]
    assert message.startswith("127.0.0.1 answered HTTP 500: bad\ufffdthing")
    assert "\u0000" not in message and all(not 0xD800 <= ord(char) <= 0xDFFF for char in message)


@pytest.mark.django_db
def test_a_hook_result_with_nul_and_lone_surrogates_is_stored_cleaned(clock, monkeypatch):
    monkeypatch.setattr("tests.hooks.on_task_execute", lambda event: HOSTILE)
    scheduler.register(definition("report", cron=NEVER))
    execution = scheduler.trigger("report")
    inline_runner(clock).tick()
    execution.refresh_from_db()
    assert (execution.status, execution.result) == (Status.SUCCESS, CLEANED)


@pytest.mark.django_db(transaction=True)
def test_a_hostile_outcome_is_stored_cleaned_by_a_threaded_runner(running, server):
    from tests.waiting import wait_for

    scheduler.register(
        definition("report", cron=NEVER, handler={"kind": "api", "url": server.url("/raw/200")})
    )
    server.next_body = json.dumps(HOSTILE).encode()
    execution = scheduler.trigger("report")
    running()
    wait_for(lambda: Execution.objects.get(pk=execution.pk).status == Status.SUCCESS, timeout=20)
    assert Execution.objects.get(pk=execution.pk).result["body"] == CLEANED


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("handler", "code"),
    [(None, "scheduler:023"), ({"kind": "fake", "result": "x"}, "scheduler:023")],
)
def test_an_outcome_the_database_refuses_is_recorded_as_a_failure_at_once_and_not_retried(
    clock, monkeypatch, handler, code
):
    original = journal.transition
    refused: list[Any] = []

    def refuse_results(*args: Any, **kwargs: Any) -> bool:
        if kwargs.get("result") is not None:
            refused.append(kwargs["result"])
            raise DataError("refused")
        return original(*args, **kwargs)

    monkeypatch.setattr(journal, "transition", refuse_results)
    scheduler.register(definition("report", cron=NEVER, handler=handler, retry={"max_attempts": 3}))
    execution = scheduler.trigger("report")
    inline_runner(clock).tick()
    execution.refresh_from_db()
    assert refused
    assert (execution.status, execution.attempt, execution.result) == (Status.FAILED, 1, None)
    assert execution.error == {
        "code": code,
        "message": "The database refused the outcome; it was not stored.",
    }
    assert ExecutionEvent.objects.filter(to_status=Status.FAILED).count() == 1
    assert ExecutionLog.objects.get().status == Status.FAILED


@pytest.mark.django_db
def test_on_postgresql_an_unescaped_nul_refused_by_the_database_is_recorded_as_a_failure(
    clock, monkeypatch, server
):
    if connection.vendor != "postgresql":
        pytest.skip("only PostgreSQL refuses NUL in JSON")
    monkeypatch.setattr(attempt, "storable", lambda value, secrets=(): value)
    scheduler.register(
        definition("report", cron=NEVER, handler={"kind": "api", "url": server.url("/raw/200")})
    )
    server.next_body = json.dumps(HOSTILE).encode()
    execution = scheduler.trigger("report")
    inline_runner(clock).tick()
    execution.refresh_from_db()
    assert execution.status == Status.FAILED and execution.error["code"] == "scheduler:025"


def test_a_broken_secrets_listing_is_a_failure_not_a_crash(monkeypatch):
    def broken(self: HttpHandler, config: dict[str, Any]) -> list[str]:
        raise RuntimeError("bug")

    monkeypatch.setattr(HttpHandler, "secrets", broken)
    task = Task(id="t", name="t", cron=NEVER, handler={"kind": "api", "url": "http://127.0.0.1:9/"})
    from scheduler_app.events import ExecutionContext, TaskEvent

    context = ExecutionContext("o", 1, 1, "tok", "t", {}, "manual", "test")
    outcome = attempt.call_handler(TaskEvent(task=task, context=context, cancelled=threading.Event()))
    assert outcome.status == Status.FAILED and outcome.error == {
        "code": "scheduler:023",
        "message": "RuntimeError: bug",
    }
