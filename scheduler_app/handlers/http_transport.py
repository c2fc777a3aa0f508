"""How the api handler connects: to checked addresses only, under one deadline that cancellation can cut short."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from requests import PreparedRequest
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import ConnectionPool, HTTPConnectionPool, HTTPSConnectionPool

from scheduler_app.handlers.http_network import SocketAddress

POLL_SECONDS = 0.1


class Aborted(Exception):
    """The attempt was cancelled or ran past its deadline; ``reason`` says which."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class Watchdog:
    """Shuts down an attempt's sockets once it is cancelled or past its deadline, so no read outlives either."""

    def __init__(self, cancelled: threading.Event, deadline: float) -> None:
        self.cancelled = cancelled
        self.deadline = deadline
        self.reason = ""
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="scheduler-http-watchdog", daemon=True)

    def __enter__(self) -> Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        self._thread.join()
        for sock in self._sockets:
            sock.close()

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def check(self) -> None:
        """Raise Aborted if the attempt was cancelled or its deadline has passed."""
        if self.reason:
            raise Aborted(self.reason)
        if self.cancelled.is_set():
            raise Aborted("cancelled")
        if self.remaining() <= 0:
            raise Aborted("timeout")

    def watch(self, sock: socket.socket) -> socket.socket:
        """Track a socket until ``forget`` or the end of the attempt; return the handle to forget."""
        with self._lock:
            if self.reason:
                raise ConnectionAbortedError(self.reason)
            # A duplicate shuts down the same connection and survives TLS wrapping,
            # which detaches the original socket object.
            handle = sock.dup()
            self._sockets.append(handle)
        return handle

    def forget(self, handle: socket.socket) -> None:
        """Stop tracking a socket; the connection only closes once both it and the original are closed."""
        with self._lock:
            if handle in self._sockets:
                self._sockets.remove(handle)
        handle.close()

    def _watch(self) -> None:
        while not self._done.wait(max(0.0, min(POLL_SECONDS, self.remaining()))):
            if self.cancelled.is_set():
                self._fire("cancelled")
                return
            if self.remaining() <= 0:
                self._fire("timeout")
                return

    def _fire(self, reason: str) -> None:
        with self._lock:
            self.reason = reason
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


@dataclass(frozen=True)
class Route:
    """Where one request may go: its host's checked addresses, under the attempt's watchdog."""

    addresses: list[SocketAddress]
    watchdog: Watchdog
    handles: list[socket.socket] = field(default_factory=list)

    def connect(self) -> socket.socket:
        """Connect to the first checked address that answers; the name is never resolved again."""
        error: OSError = ConnectionError("no address to connect to")
        for family, sockaddr in self.addresses:
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.handles.append(self.watchdog.watch(sock))
                sock.settimeout(max(self.watchdog.remaining(), 0.001))
                sock.connect(sockaddr)
            except OSError as exc:
                sock.close()
                error = exc
            else:
                return sock
        raise error

    def close(self) -> None:
        """Let the watchdog forget this route's sockets, once their connections are closed."""
        for handle in self.handles:
            self.watchdog.forget(handle)
        self.handles.clear()


class PinnedHTTPConnection(HTTPConnection):
    """Connects to the route and never resolves the host; the Host header keeps the URL's host."""

    def __init__(self, *args: Any, route: Route, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.route = route

    def _new_conn(self) -> socket.socket:
        return self.route.connect()


class PinnedHTTPSConnection(PinnedHTTPConnection, HTTPSConnection):
    """Connects to the route, while SNI and the certificate check keep the URL's host."""


class PinnedHTTPConnectionPool(HTTPConnectionPool):
    ConnectionCls = PinnedHTTPConnection


class PinnedHTTPSConnectionPool(HTTPSConnectionPool):
    ConnectionCls = PinnedHTTPSConnection


class PinnedAdapter(HTTPAdapter):
    """A requests transport whose every connection goes to one route."""

    def __init__(self, route: Route) -> None:
        super().__init__(max_retries=0)
        self.route = route
        self._pools: list[HTTPConnectionPool] = []

    def get_connection_with_tls_context(
        self,
        request: PreparedRequest,
        verify: bool | str | None,
        proxies: Any = None,
        cert: tuple[str, str] | str | None = None,
    ) -> ConnectionPool:
        host_params, pool_kwargs = self.build_connection_pool_key_attributes(
            request, True if verify is None else verify, cert
        )
        # With no port, http.client would read one off an IPv6 host ("::1" as host ":", port 1).
        host = host_params["host"]
        port = host_params["port"] or (443 if host_params["scheme"] == "https" else 80)
        pool: HTTPConnectionPool
        if host_params["scheme"] == "https":
            pool = PinnedHTTPSConnectionPool(host, port, route=self.route, **pool_kwargs)
        else:
            pool = PinnedHTTPConnectionPool(host, port, route=self.route)
        self._pools.append(pool)
        return pool

    def close(self) -> None:
        super().close()
        for pool in self._pools:
            pool.close()
        self.route.close()
