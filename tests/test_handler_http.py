"""The api handler against real local HTTP servers: validation, limits, SSRF policy, secrets, cancellation."""

from __future__ import annotations

import base64
import ipaddress
import json
import logging
import shutil
import socket
import ssl
import subprocess
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import requests.adapters
from hypothesis import given
from hypothesis import strategies as st

from scheduler_app import scheduler
from scheduler_app.exceptions import InvalidDefinition
from scheduler_app.handlers.http import HttpHandler, mask_url
from scheduler_app.handlers.http_network import NetworkPolicy
from scheduler_app.models import Execution, ExecutionEvent, ExecutionLog, Status, Task
from tests.factories import definition, inline_runner
from tests.http_servers import NEVER, MiB, Server, failure, gzip_of_zeros, run_direct, start, stop, use_http
from tests.waiting import wait_for


@pytest.fixture(autouse=True)
def _allow_local_servers(settings: Any) -> None:
    use_http(settings, ALLOWED_NETWORKS=["127.0.0.0/8"])


# -- validation ---------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"url": None}, "handler.url"),
        ({"url": 5}, "handler.url"),
        ({"url": "ftp://example.com/file"}, "handler.url"),
        ({"url": "example.com/hook"}, "handler.url"),
        ({"url": "http:///no-host"}, "handler.url"),
        ({"url": "http://example.com:99999/"}, "handler.url"),
        ({"url": "http://exa mple.com/"}, "handler.url"),
        ({"url": "http://[fe80::1%25eth0]:8080/"}, "handler.url"),
        ({"url": "http://[::1%5C]/"}, "handler.url"),
        ({"method": "HEAD"}, "handler.method"),
        ({"method": "post"}, "handler.method"),
        ({"headers": ["X-A"]}, "handler.headers"),
        ({"headers": {"X-A": 5}}, "handler.headers"),
        ({"headers": {"Bad Name": "v"}}, "handler.headers"),
        ({"headers": {"X-A": "a\r\nX-Injected: b"}}, "handler.headers"),
        ({"headers": {"X-A": "caf\u00e9 \u2603"}}, "handler.headers"),
        ({"headers": {"idempotency-key": "mine"}}, "handler.headers"),
        ({"headers": {"Host": "elsewhere.example"}}, "handler.headers"),
        ({"timeout": 0}, "handler.timeout"),
        ({"timeout": -1}, "handler.timeout"),
        ({"timeout": "30"}, "handler.timeout"),
        ({"timeout": True}, "handler.timeout"),
        ({"timeout": 3601}, "handler.timeout"),
        ({"max_response_bytes": 0}, "handler.max_response_bytes"),
        ({"max_response_bytes": 1.5}, "handler.max_response_bytes"),
        ({"max_response_bytes": "1024"}, "handler.max_response_bytes"),
        ({"max_response_bytes": True}, "handler.max_response_bytes"),
        ({"max_response_bytes": 1024**3 + 1}, "handler.max_response_bytes"),
        ({"follow_redirects": "yes"}, "handler.follow_redirects"),
        ({"proxy": "http://proxy.example"}, "handler"),
    ],
)
def test_an_invalid_api_config_is_refused_at_register_and_writes_nothing(changes, field):
    config = {"kind": "api", "url": "https://example.com/hook", **changes}
    config = {key: value for key, value in config.items() if value is not None}
    with pytest.raises(InvalidDefinition) as caught:
        scheduler.register(definition("call", handler=config))
    assert field in caught.value.errors
    assert not Task.objects.exists() and not Execution.objects.exists()


@pytest.mark.django_db
def test_an_invalid_update_of_the_api_config_changes_nothing():
    valid = {"kind": "api", "url": "https://example.com/hook", "method": "POST"}
    scheduler.register(definition("call", handler=valid))
    with pytest.raises(InvalidDefinition) as caught:
        scheduler.update_task("call", handler={**valid, "timeout": 0})
    assert set(caught.value.errors) == {"handler.timeout"}
    assert Task.objects.get().handler == valid


@pytest.mark.django_db
def test_a_complete_api_config_registers():
    config = {
        "kind": "api",
        "url": "https://user:pass@example.com:8443/hook?x=1",
        "method": "PATCH",
        "headers": {"Authorization": "Bearer abc", "X-Trace": ""},
        "body": {"list": [1, 2], "nested": {"ok": True}},
        "timeout": 2.5,
        "max_response_bytes": 10 * MiB,
        "follow_redirects": True,
    }
    assert scheduler.register(definition("call", handler=config)).handler == config


def test_validation_messages_never_repeat_secret_values():
    config = {
        "kind": "api",
        "url": "ftp://user:pw-SECRET-1@example.com/?token=q-SECRET-2",
        "headers": {"X-Api-Key": "h-SECRET-3\r\n"},
    }
    errors = HttpHandler().validate(config)
    assert set(errors) == {"url", "headers"}
    assert "SECRET" not in json.dumps(errors)


# -- success through the runner -------------------------------------------------


@pytest.mark.django_db
def test_a_call_through_the_runner_sends_the_identity_headers_and_stores_the_json_body(clock, server):
    config = {
        "kind": "api",
        "url": server.url("/echo?page=2"),
        "method": "POST",
        "headers": {"X-Custom": "hello"},
        "body": {"report": "daily"},
    }
    scheduler.register(definition("call", cron=NEVER, handler=config))
    execution = scheduler.trigger("call")
    inline_runner(clock).tick()
    execution.refresh_from_db()
    assert execution.status == Status.SUCCESS
    received = server.requests[0]
    assert received["method"] == "POST" and json.loads(received["body"]) == {"report": "daily"}
    headers = received["headers"]
    assert headers["Idempotency-Key"] == str(execution.occurrence_id)
    assert headers["X-Scheduler-Sequence"] == str(execution.sequence)
    assert headers["X-Scheduler-Attempt"] == "1"
    assert headers["X-Custom"] == "hello" and headers["Content-Type"] == "application/json"
    assert execution.execution_token and execution.execution_token not in received["raw"]
    # A configured header value is a secret: the echo of it is stored masked.
    assert execution.result == {
        "status": 200,
        "body": {
            "method": "POST",
            "path": "/echo",
            "headers": {**headers, "X-Custom": "***"},
            "body": received["body"],
        },
        "truncated": False,
    }
    assert ExecutionLog.objects.get().result == execution.result


@pytest.mark.django_db
def test_a_non_2xx_answer_fails_with_025_and_the_retry_policy_applies(clock, server):
    config = {"kind": "api", "url": server.url("/status/503")}
    scheduler.register(
        definition("call", cron=NEVER, handler=config, retry={"max_attempts": 2, "backoff": [10]})
    )
    execution = scheduler.trigger("call")
    runner = inline_runner(clock)
    runner.tick()
    execution.refresh_from_db()
    assert (execution.status, execution.attempt) == (Status.PENDING, 1)
    assert execution.error["code"] == "scheduler:025"
    assert execution.error["message"].startswith("127.0.0.1 answered HTTP 503: failed for None")
    clock.advance(10)
    runner.tick()
    execution.refresh_from_db()
    assert (execution.status, execution.attempt) == (Status.FAILED, 2)
    keys = [(r["headers"]["Idempotency-Key"], r["headers"]["X-Scheduler-Attempt"]) for r in server.requests]
    assert keys == [(str(execution.occurrence_id), "1"), (str(execution.occurrence_id), "2")]
    assert list(ExecutionLog.objects.values_list("status", flat=True)) == ["failed", "failed"]


# -- results ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content_type", "text", "body"),
    [
        ("application/json", '{"ok": true}', {"ok": True}),
        ("application/problem+json; charset=utf-8", "[1, 2]", [1, 2]),
        ("application/json", "{not json", "{not json"),
        ("application/json", '{"x": NaN}', '{"x": NaN}'),
        ("text/plain; charset=utf-8", '{"ok": true}', '{"ok": true}'),
        ("text/plain; charset=utf-8", "", ""),
    ],
)
def test_the_result_is_the_body_decoded_as_json_when_the_response_is_json(server, content_type, text, body):
    query = urlencode({"type": content_type, "body64": base64.urlsafe_b64encode(text.encode()).decode()})
    assert run_direct(url=server.url(f"/respond?{query}")) == {
        "status": 200,
        "body": body,
        "truncated": False,
    }


def test_a_long_body_is_stored_cut_at_result_max_bytes(settings, server):
    use_http(settings, ALLOWED_NETWORKS=["127.0.0.0/8"], RESULT_MAX_BYTES=1000)
    assert run_direct(url=server.url("/bytes/5000")) == {"status": 200, "body": "a" * 1000, "truncated": True}


@pytest.mark.parametrize(("size", "allowed"), [(10 * MiB, True), (10 * MiB + 1, False)])
def test_max_response_bytes_allows_a_body_up_to_the_limit(server, size, allowed):
    config = {"url": server.url(f"/bytes/{size}"), "max_response_bytes": 10 * MiB}
    if allowed:
        assert run_direct(**config)["truncated"] is True
    else:
        assert failure(**config) == f"The response from 127.0.0.1 is larger than {10 * MiB} bytes."


# -- one deadline -------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/drip", "/drip/no-length"])
def test_a_dripping_body_is_cut_at_the_deadline(clock, server, path):
    scheduler.register(
        definition("call", cron=NEVER, handler={"kind": "api", "url": server.url(path), "timeout": 1})
    )
    execution = scheduler.trigger("call")
    runner = inline_runner(clock)
    started = time.monotonic()
    runner.tick()
    elapsed = time.monotonic() - started
    execution.refresh_from_db()
    assert execution.status == Status.FAILED
    assert execution.error == {"code": "scheduler:025", "message": "No complete response within 1 s."}
    assert elapsed < 10  # the drip would last 200 s


def test_a_server_that_never_answers_is_cut_at_the_deadline(server):
    started = time.monotonic()
    assert failure(url=server.url("/hang"), timeout=0.5) == "No complete response within 0.5 s."
    assert time.monotonic() - started < 10  # the server would hang for 30 s


# -- size limits, with flat memory ----------------------------------------------


def peak_memory(call: Any) -> int:
    tracemalloc.start()
    try:
        call()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def test_a_huge_body_stops_at_the_limit_with_flat_memory(server):
    total = 256 * MiB
    peak = peak_memory(lambda: failure(url=server.url(f"/bytes/{total}"), max_response_bytes=MiB))
    assert peak < 4 * MiB
    wait_for(lambda: server.finished == 1)
    assert server.bytes_sent < total / 4


def test_a_gzip_bomb_stops_at_the_limit_with_flat_memory(server):
    size = 256 * MiB
    gzip_of_zeros(size)  # built before measuring: the server shares this process
    messages: list[str] = []
    peak = peak_memory(lambda: messages.append(failure(url=server.url(f"/gzip/{size}"))))
    assert messages == [f"The response from 127.0.0.1 is larger than {MiB} bytes."]
    assert peak < 4 * MiB


# -- which addresses may be reached -----------------------------------------------


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "2130706433", "0177.0.0.1", "0x7f.0.0.1", "127.1", "[::ffff:127.0.0.1]", "localhost"],
)
def test_every_spelling_of_a_loopback_address_is_refused_without_connecting(settings, server, host):
    use_http(settings, ALLOWED_NETWORKS=[])
    message = failure(url=f"http://{host}:{server.port}/echo?token=q-SECRET")
    assert "not allowed (loopback)" in message and "SECRET" not in message
    assert server.connections == 0


@pytest.mark.parametrize(
    ("host", "category"),
    [
        ("169.254.169.254", "link-local"),
        ("[::ffff:169.254.169.254]", "link-local"),
        ("[64:ff9b::a9fe:a9fe]", "link-local"),
        ("[fe80::1]", "link-local"),
        ("10.0.0.1", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "private"),
        ("[fd00::1]", "private"),
        ("[fec0::1]", "private"),
        ("[::1]", "loopback"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("240.0.0.1", "reserved"),
    ],
)
def test_private_link_local_and_special_addresses_are_refused_by_default(settings, host, category):
    use_http(settings)
    assert f"not allowed ({category})" in failure(url=f"http://{host}/")


@pytest.mark.parametrize("address", ["8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"])
def test_public_addresses_are_allowed_by_default(address):
    assert NetworkPolicy().refusal("example.com", ipaddress.ip_address(address)) == ""


def test_allow_private_networks_opens_private_and_loopback_addresses_but_not_link_local(settings, server):
    use_http(settings, ALLOW_PRIVATE_NETWORKS=True)
    assert run_direct(url=server.url("/echo"))["status"] == 200
    assert "not allowed (link-local)" in failure(url="http://169.254.169.254/latest/meta-data/")


def test_allowed_networks_may_name_hosts(settings, server):
    use_http(settings, ALLOWED_NETWORKS=["LOCALHOST"])
    assert run_direct(url=server.url("/echo", host="localhost"))["status"] == 200
    assert "not allowed (loopback)" in failure(url=server.url("/echo"))


def test_the_host_is_resolved_once_and_the_checked_address_is_the_one_connected(monkeypatch, server):
    real = socket.getaddrinfo
    lookups: list[str] = []

    def rebinding(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != "pinned.test":
            return real(host, port, *args, **kwargs)
        lookups.append(host)
        # The second answer points where nothing listens: used, it would fail the call.
        address = "127.0.0.1" if len(lookups) == 1 else "127.0.0.2"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    assert run_direct(url=server.url("/echo", host="pinned.test"))["status"] == 200
    assert lookups == ["pinned.test"]
    assert server.requests[0]["headers"]["Host"] == f"pinned.test:{server.port}"


@pytest.fixture
def tls_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Server, list[str]]]:
    """An HTTPS server for pinned.test, trusted by requests, recording the SNI names it is asked for."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=pinned.test",
         "-addext", "subjectAltName=DNS:pinned.test", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    names: list[str] = []
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    context.sni_callback = lambda sock, name, ctx: names.append(name)
    monkeypatch.setattr(requests.adapters, "DEFAULT_CA_BUNDLE_PATH", str(cert))
    real = socket.getaddrinfo

    def resolve(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        return real("127.0.0.1" if host in ("pinned.test", "other.test") else host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    local = start(Server(tls=context))
    yield local, names
    stop(local)


def test_https_checks_the_certificate_and_sends_sni_for_the_host_name_not_the_address(tls_server):
    server, names = tls_server
    assert run_direct(url=server.url("/echo", host="pinned.test", scheme="https"))["status"] == 200
    assert names == ["pinned.test"]
    assert server.requests[0]["headers"]["Host"] == f"pinned.test:{server.port}"
    assert failure(url=server.url("/echo", host="other.test", scheme="https")) == (
        "TLS with other.test failed (handshake or certificate)."
    )


def test_environment_proxies_and_netrc_never_apply(monkeypatch, tmp_path, server):
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password from-netrc\n")
    monkeypatch.setenv("NETRC", str(netrc))
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, "http://10.255.255.1:9")
    assert run_direct(url=server.url("/echo"))["status"] == 200
    assert "Authorization" not in server.requests[0]["headers"]


# -- redirects ----------------------------------------------------------------


def test_redirects_are_not_followed_by_default(server):
    assert failure(url=server.url("/redirect/1")) == (
        "127.0.0.1 answered HTTP 302, a redirect; follow_redirects is off."
    )
    assert len(server.requests) == 1


def test_up_to_three_redirects_are_followed_when_allowed(server):
    result = run_direct(url=server.url("/redirect/3"), follow_redirects=True)
    assert result["body"]["path"] == "/echo"
    assert [r["path"] for r in server.requests] == ["/redirect/3", "/redirect/2", "/redirect/1", "/echo"]
    assert len({r["headers"]["Idempotency-Key"] for r in server.requests}) == 1


def test_a_fourth_redirect_fails(server):
    assert failure(url=server.url("/redirect/4"), follow_redirects=True) == (
        "More than 3 redirects, the last from 127.0.0.1."
    )
    assert len(server.requests) == 4


def test_each_redirect_hop_is_checked_against_the_policy(settings, server, other_server):
    use_http(settings, ALLOWED_NETWORKS=["127.0.0.1/32"])
    target = other_server.url("/echo", host="127.0.0.2")
    message = failure(url=server.url(f"/redirect-to?url={target}"), follow_redirects=True)
    assert "127.0.0.2" in message and "not allowed (loopback)" in message
    assert other_server.connections == 0


@pytest.mark.parametrize("location", ["file:///etc/passwd", "gopher://127.0.0.1/", "http://bad host/"])
def test_a_redirect_to_a_url_that_is_not_http_fails(server, location):
    message = failure(url=server.url(f"/redirect-to?{urlencode({'url': location})}"), follow_redirects=True)
    assert message == "127.0.0.1 redirected to a URL that cannot be used."
    assert len(server.requests) == 1


@pytest.mark.parametrize(("status", "method"), [(303, "GET"), (307, "POST")])
def test_a_redirect_keeps_or_drops_the_method_as_browsers_do(server, status, method):
    target = server.url("/echo")
    run_direct(
        url=server.url(f"/redirect-to?status={status}&url={target}"),
        method="POST",
        body=[1],
        follow_redirects=True,
    )
    last = server.requests[-1]
    assert (last["method"], last["body"]) == (method, "[1]" if method == "POST" else "")


def test_credentials_are_only_sent_to_the_configured_origin(server):
    elsewhere = server.url("/echo", host="localhost")
    url = server.url(f"/redirect-to?url={elsewhere}").replace("://", "://user:pw-SECRET@", 1)
    run_direct(url=url, headers={"X-Api-Key": "h-SECRET"}, follow_redirects=True)
    first, second = server.requests
    assert first["headers"]["X-Api-Key"] == "h-SECRET" and "Authorization" in first["headers"]
    assert "X-Api-Key" not in second["headers"] and "Authorization" not in second["headers"]
    assert second["headers"]["Idempotency-Key"] == first["headers"]["Idempotency-Key"]


# -- secrets ------------------------------------------------------------------


def test_mask_hides_header_values_userinfo_and_query_values():
    config = {
        "kind": "api",
        "url": "https://user:pw@example.com/hook?token=abc&flag&x=1#frag",
        "headers": {"Authorization": "Bearer abc"},
        "body": {"kept": True},
    }
    assert HttpHandler().mask(config) == {
        "kind": "api",
        "url": "https://user:***@example.com/hook?token=***&***&x=***#***",
        "headers": {"Authorization": "***"},
        "body": {"kept": True},
    }
    assert mask_url("https://only-a-token@example.com/") == "https://***@example.com/"
    assert config["headers"] == {"Authorization": "Bearer abc"}


def test_an_edited_url_keeps_the_stored_secrets_it_sends_back_masked():
    from scheduler_app.handlers import registry

    stored = {
        "kind": "api",
        "url": "https://user:pw@example.com/hook?token=abc&flag&a=1&a=2#frag",
        "headers": {"Authorization": "Bearer abc"},
    }
    shown = registry.masked(stored)
    edited = {**shown, "url": shown["url"].replace("/hook", "/v2/hook"), "method": "PUT"}
    assert registry.unmask(edited, stored) == {
        **stored,
        "url": "https://user:pw@example.com/v2/hook?token=abc&flag&a=1&a=2#frag",
        "method": "PUT",
    }
    # A value typed anew is kept as typed; a masked name the stored URL lacks stays masked.
    assert (
        registry.unmask({**shown, "url": "https://user:***@example.com/?token=new&other=***"}, stored)["url"]
        == "https://user:pw@example.com/?token=new&other=***"
    )
    lone = {"kind": "api", "url": "https://tok@example.com/"}
    assert registry.unmask({"kind": "api", "url": "https://***@example.com/x"}, lone)["url"] == (
        "https://tok@example.com/x"
    )


@pytest.mark.parametrize(
    "url",
    [
        "https://user:***@elsewhere.example/hook?token=***",
        "http://user:***@example.com/hook?token=***",
        "https://user:***@example.com:8443/hook?token=***",
    ],
)
def test_masked_secrets_are_not_restored_for_another_destination_and_are_refused(url):
    from scheduler_app.handlers import registry

    stored = {"kind": "api", "url": "https://user:pw@example.com/hook?token=abc", "headers": {"X-Key": "k3y"}}
    shown = registry.masked(stored)
    moved = registry.unmask({**shown, "url": url}, stored)
    assert moved == {**shown, "url": url}
    errors = HttpHandler().validate(moved)
    assert set(errors) == {"url", "headers"}
    assert "stored secret" in errors["url"][0] and "X-Key" in errors["headers"][0]


secret_text = st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=8, max_size=20).map("S3CRET".__add__)


@given(password=secret_text, query_value=secret_text, header_value=secret_text)
def test_masked_configs_never_show_a_secret(password, query_value, header_value):
    config = {
        "kind": "api",
        "url": f"https://user:{password}@example.com/p?a={query_value}&{query_value}",
        "headers": {"X-Key": header_value},
    }
    assert "S3CRET" not in json.dumps(HttpHandler().mask(config))


@pytest.mark.django_db
def test_secrets_never_reach_the_journal_the_logs_or_log_records(clock, server, caplog):
    caplog.set_level(logging.DEBUG, logger="scheduler_app")
    url = server.url("/status/500?token=q-SECRET-2").replace("://", "://user:pw-SECRET-1@")
    config = {"kind": "api", "url": url, "headers": {"X-Api-Key": "h-SECRET-3"}}
    scheduler.register(definition("call", cron=NEVER, handler=config))
    execution = scheduler.trigger("call")
    inline_runner(clock).tick()
    execution.refresh_from_db()
    assert server.requests[0]["headers"]["X-Api-Key"] == "h-SECRET-3"
    assert (
        execution.error["message"]
        == "127.0.0.1 answered HTTP 500: failed for *** Basic *** with /status/500?token=***"
    )
    stored = [
        execution.error,
        execution.result,
        list(ExecutionEvent.objects.values("reason", "result", "error")),
        list(ExecutionLog.objects.values("result", "error")),
        caplog.text,
    ]
    assert "SECRET" not in json.dumps(stored, default=str)


# -- cancellation ---------------------------------------------------------------


@pytest.mark.parametrize("path", ["/hang", "/drip"])
def test_cancellation_aborts_a_request_in_flight_promptly(server, path):
    cancelled = threading.Event()
    cancelled_at: list[float] = []

    def cancel_once_the_request_arrives() -> None:
        wait_for(lambda: server.requests)
        cancelled_at.append(time.monotonic())
        cancelled.set()

    threading.Thread(target=cancel_once_the_request_arrives, daemon=True).start()
    assert run_direct(cancelled=cancelled, url=server.url(path), timeout=60) is None
    assert time.monotonic() - cancelled_at[0] < 10  # not the 60 s timeout, nor the server's 30 s


def test_an_attempt_cancelled_before_it_starts_sends_nothing(server):
    cancelled = threading.Event()
    cancelled.set()
    assert run_direct(cancelled=cancelled, url=server.url("/echo")) is None
    assert server.connections == 0
