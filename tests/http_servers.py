"""Local HTTP servers that record what reaches them, and running the api handler outside the runner."""

from __future__ import annotations

import base64
import functools
import json
import socket
import ssl
import threading
import uuid
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, quote_plus, urlsplit

import pytest
from django.conf import settings as django_settings

from scheduler_app.events import ExecutionContext, TaskEvent
from scheduler_app.handlers.base import HandlerError
from scheduler_app.handlers.http import HttpHandler
from scheduler_app.models import Task

MiB = 1024 * 1024
NEVER = "0 0 1 1 *"


class Server(ThreadingHTTPServer):
    """A local HTTP server that records what reaches it."""

    daemon_threads = True

    def __init__(self, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None) -> None:
        super().__init__((host, 0), Endpoints)
        self.tls = tls
        self.lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self.connections = 0
        self.bytes_sent = 0
        self.finished = 0
        self.stop = threading.Event()
        # What /raw/<status> answers.
        self.next_body = b""

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        with self.lock:
            self.connections += 1
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_side=True)
        return sock, address

    @property
    def port(self) -> int:
        return self.server_address[1]

    def url(self, path: str, host: str = "127.0.0.1", scheme: str = "http") -> str:
        return f"{scheme}://{host}:{self.port}{path}"


class Endpoints(BaseHTTPRequestHandler):
    server: Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def handle_any(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        parts = urlsplit(self.path)
        query = {key: values[0] for key, values in parse_qs(parts.query).items()}
        record = {"method": self.command, "path": parts.path, "headers": dict(self.headers), "body": body}
        record["raw"] = f"{self.requestline}\n{self.headers}\n{body}"
        with self.server.lock:
            self.server.requests.append(record)
        name, _, argument = parts.path.strip("/").partition("/")
        try:
            route = getattr(self, f"route_{name.replace('-', '_')}", None)
            if route is None:
                self.reply(404, b"no such route", "text/plain")
            else:
                route(argument, query, record)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            pass
        finally:
            with self.server.lock:
                self.server.finished += 1

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = handle_any

    def reply(self, status: int, body: bytes, content_type: str, **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def route_echo(self, argument: str, query: dict[str, str], record: dict[str, Any]) -> None:
        data = {key: record[key] for key in ("method", "path", "headers", "body")}
        self.reply(200, json.dumps(data).encode(), "application/json")

    def route_respond(self, argument: str, query: dict[str, str], record: dict[str, Any]) -> None:
        # The body travels base64-encoded: a query value is a secret, masked wherever it is echoed.
        body = base64.urlsafe_b64decode(query.get("body64", ""))
        self.reply(int(query.get("status", 200)), body, query["type"])

    def route_status(self, argument: str, query: dict[str, str], record: dict[str, Any]) -> None:
        # Reflects what it received, as careless servers do in error pages.
        headers = record["headers"]
        reflected = f"failed for {headers.get('X-Api-Key')} {headers.get('Authorization')} with {self.path}"
        self.reply(int(argument), reflected.encode(), "text/plain")

    def route_reflect(self, argument: str, query: dict[str, str], record: dict[str, Any]) -> None:
        # Reflects the request, and its header and query values percent-encoded, as text.
        values = [*record["headers"].values(), *query.values()]
        encoded = [form for value in values for form in (quote(value, safe=""), quote_plus(value))]
        self.reply(int(argument), "\n".join([record["raw"], *values, *encoded]).encode(), "text/plain")

    def route_pad(self, argument: str, query: dict[str, str], record: dict[str, Any]) -> None:
        # A configured header value placed after ``argument`` bytes: across a cut at will.
        body = "a" * int(argument) + record["headers"].get("X-Api-Key", "") + "b" * 2000
        self.reply(200, body.encode(), "text/plain")

    def route_raw(self, argument: str, query: dict[str, str], record: dict[str, Any]) -> None:
        status = int(argument)
        self.reply(status, self.server.next_body, "application/json" if status == 200 else "text/plain")

    def route_bytes(self, argument: str, query: dict[str, str], record: dict[str, Any]) -> None:
        size = int(argument)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        chunk = b"a" * 65536
        while size > 0:
            self.wfile.write(chunk[:size])
            with self.server.lock:
                self.server.bytes_sent += min(size, len(chunk))
            size -= len(chunk)

    def route_gzip(self, argument: str, query: dict[str, str], record: dict[str, Any]) -> None:
        self.reply(200, gzip_of_zeros(int(argument)), "text/plain", Content_Encoding="gzip")

    def route_drip(self, argument: str, query: dict[str, str], record: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        if argument != "no-length":
            self.send_header("Content-Length", "1000")
        self.end_headers()
        for _ in range(1000):
            self.wfile.write(b"x")
            self.wfile.flush()
            if self.server.stop.wait(0.2):
                return

    def route_hang(self, argument: str, query: dict[str, str], record: dict[str, Any]) -> None:
        self.server.stop.wait(30)

    def route_redirect(self, argument: str, query: dict[str, str], record: dict[str, Any]) -> None:
        hops = int(argument)
        target = f"/redirect/{hops - 1}" if hops > 1 else "/echo"
        self.reply(302, b"", "text/plain", Location=target)

    def route_redirect_to(self, argument: str, query: dict[str, str], record: dict[str, Any]) -> None:
        self.reply(int(query.get("status", 302)), b"", "text/plain", Location=query["url"])


@functools.cache
def gzip_of_zeros(size: int) -> bytes:
    """A gzip bomb: ``size`` zero bytes compressed about a thousandfold, built without holding them."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(MiB)
    parts = [compressor.compress(zeros) for _ in range(size // MiB)]
    return b"".join(parts) + compressor.flush()


def start(server: Server) -> Server:
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


def stop(server: Server) -> None:
    server.stop.set()
    server.shutdown()
    server.server_close()


def use_http(settings: Any, **http: Any) -> None:
    settings.SCHEDULER_APP = {**django_settings.SCHEDULER_APP, "HTTP": http}


def run_direct(cancelled: threading.Event | None = None, **config: Any) -> Any:
    """Run the handler outside the runner, as a worker would."""
    config = {"kind": "api", **config}
    assert HttpHandler().validate(config) == {}
    task = Task(id="direct", name="direct", cron=NEVER, handler=config)
    context = ExecutionContext(
        occurrence_id=str(uuid.uuid4()),
        sequence=7,
        attempt=1,
        execution_token="token-never-sent",
        task_id="direct",
        params={},
        trigger_type="manual",
        trigger_source="test",
    )
    return HttpHandler().run(TaskEvent(task=task, context=context, cancelled=cancelled or threading.Event()))


def failure(**config: Any) -> str:
    with pytest.raises(HandlerError) as caught:
        run_direct(**config)
    assert caught.value.code == "scheduler:025"
    return caught.value.message
