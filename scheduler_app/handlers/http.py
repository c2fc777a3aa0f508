"""The ``api`` handler kind: one HTTP request per attempt, bounded in time, size and reach."""

from __future__ import annotations

import base64
import contextlib
import functools
import http.client
import json
import re
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, quote_plus, unquote, unquote_plus, urljoin, urlsplit, urlunsplit

import requests
import urllib3
from requests.exceptions import InvalidHeader
from requests.utils import check_header_validity, default_headers, get_auth_from_url

from scheduler_app.conf import scheduler_settings
from scheduler_app.events import ExecutionContext, TaskEvent
from scheduler_app.handlers.base import Handler, HandlerError
from scheduler_app.handlers.http_network import AddressRefused, NetworkPolicy
from scheduler_app.handlers.http_transport import Aborted, PinnedAdapter, Route, Watchdog
from scheduler_app.storable import storable
from scheduler_app.values import is_number, short_text

API_FAILED = "scheduler:025"
KEYS = frozenset(
    {"kind", "url", "method", "headers", "body", "timeout", "max_response_bytes", "follow_redirects"}
)
METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH")
SCHEMES = ("http", "https")
MAX_URL_LENGTH = 2048
MAX_TIMEOUT = 3600
# The largest max_response_bytes (1 GiB): the body is streamed, but reading it takes time and bandwidth.
MAX_RESPONSE_BYTES = 1024 * 1024 * 1024
MAX_REDIRECTS = 3
REDIRECTS = frozenset({301, 302, 303, 307, 308})
SCHEDULER_HEADERS = frozenset({"idempotency-key", "x-scheduler-sequence", "x-scheduler-attempt"})
TRANSPORT_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})
HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
CHUNK_BYTES = 64 * 1024
EXCERPT_BYTES = 1024
EXCERPT_CHARS = 200
MASK = "***"
# Shorter values are not worth scrubbing from results and excerpts and would garble them. Query
# values are often plain words or numbers ("json", "2026"); a token there is longer.
MIN_SECRET_LENGTH = 4
MIN_QUERY_SECRET_LENGTH = 8
TRANSPORT_ERRORS = (
    requests.RequestException,
    urllib3.exceptions.HTTPError,
    http.client.HTTPException,
    OSError,
)


class HttpHandler(Handler):
    """Calls an HTTP endpoint; the result is ``{"status", "body", "truncated"}``."""

    kind = "api"

    def validate(self, config: dict[str, Any]) -> dict[str, list[str]]:
        errors: dict[str, list[str]] = {}
        unknown = sorted(str(key) for key in config if key not in KEYS)
        if unknown:
            errors[""] = [f"Unknown keys: {', '.join(short_text(key) for key in unknown)}."]
        url_errors = _url_errors(config["url"]) if "url" in config else ["This field is required."]
        if url_errors:
            errors["url"] = url_errors
        if config.get("method", "GET") not in METHODS:
            errors["method"] = [f"Must be one of: {', '.join(METHODS)}."]
        header_errors = _header_errors(config.get("headers", {}))
        if header_errors:
            errors["headers"] = header_errors
        timeout = config.get("timeout")
        if "timeout" in config and not (is_number(timeout) and 0 < timeout <= MAX_TIMEOUT):
            errors["timeout"] = [f"Must be a number of seconds above 0 and at most {MAX_TIMEOUT}."]
        size = config.get("max_response_bytes")
        if "max_response_bytes" in config and not (
            is_number(size) and isinstance(size, int) and 0 < size <= MAX_RESPONSE_BYTES
        ):
            errors["max_response_bytes"] = [
                f"Must be a positive integer of bytes, at most {MAX_RESPONSE_BYTES}."
            ]
        if not isinstance(config.get("follow_redirects", False), bool):
            errors["follow_redirects"] = ["Must be true or false."]
        return errors

    def mask(self, config: dict[str, Any]) -> dict[str, Any]:
        masked = dict(config)
        if isinstance(config.get("headers"), dict):
            masked["headers"] = dict.fromkeys(config["headers"], MASK)
        if isinstance(config.get("url"), str):
            masked["url"] = mask_url(config["url"])
        return masked

    def unmask(self, submitted: dict[str, Any], stored: dict[str, Any]) -> dict[str, Any]:
        """Masked secrets sent back are kept only for the stored destination: with another scheme,
        host or port none is restored, and a *** left in is refused by ``validate``."""
        if not _same_origin(submitted.get("url"), stored.get("url")):
            return submitted
        restored = dict(super().unmask(submitted, stored))
        if MASK in restored["url"]:
            restored["url"] = unmask_url(restored["url"], stored["url"])
        # Where the restored URL really goes decides, whatever the text around the *** said.
        return restored if _same_origin(restored["url"], stored["url"]) else submitted

    def secrets(self, config: dict[str, Any]) -> list[str]:
        return _secrets(config)

    def run(self, event: TaskEvent) -> Any:
        config = event.task.handler or {}
        if _url_errors(config.get("url")):
            # Stored before its URL was refused, or written around validation.
            raise HandlerError(API_FAILED, "The task's URL cannot be used; correct it in the task.")
        http_settings = scheduler_settings.HTTP
        timeout = config.get("timeout", http_settings["TIMEOUT"])
        call = _Call(
            config=config,
            context=event.context,
            policy=NetworkPolicy.from_settings(http_settings),
            max_bytes=config.get("max_response_bytes", http_settings["MAX_RESPONSE_BYTES"]),
            keep_bytes=http_settings["RESULT_MAX_BYTES"],
            secrets=_secrets(config),
        )
        with Watchdog(event.cancelled, time.monotonic() + timeout) as watchdog:
            try:
                response = call.follow(watchdog)
            except Aborted as exc:
                if exc.reason == "cancelled":
                    return None
                raise HandlerError(API_FAILED, f"No complete response within {timeout:g} s.") from None
        return response.result(call.keep_bytes, call.secrets)


@dataclass(frozen=True)
class _Response:
    """What one exchange returned: the decoded body up to what is kept, and its full decoded size."""

    host: str
    status: int
    content_type: str
    encoding: str | None
    location: str | None
    body: bytes
    size: int

    def result(self, keep_bytes: int, secrets: list[str]) -> dict[str, Any]:
        """The stored result: JSON when the response is JSON and complete, else text cut at keep_bytes.

        A secret across the cut is cut off whole, so no part of it is kept.
        """
        truncated = self.size > keep_bytes
        if not truncated and _is_json_type(self.content_type):
            try:
                return {
                    "status": self.status,
                    "body": json.loads(self.body, parse_constant=_refuse),
                    "truncated": False,
                }
            except (ValueError, RecursionError):
                pass
        text = _decode(self.body, self.encoding)
        cut = len(_decode(self.body[:keep_bytes], self.encoding))
        return {"status": self.status, "body": _shown(text, cut, secrets), "truncated": truncated}


@dataclass(frozen=True)
class _Call:
    """One attempt's request, followed through at most MAX_REDIRECTS redirects when allowed."""

    config: dict[str, Any]
    context: ExecutionContext
    policy: NetworkPolicy
    max_bytes: int
    keep_bytes: int
    secrets: list[str]

    def follow(self, watchdog: Watchdog) -> _Response:
        url: str = self.config["url"]
        method: str = self.config.get("method", "GET")
        body = self.config.get("body")
        follow = bool(self.config.get("follow_redirects", False))
        hops_left = MAX_REDIRECTS if follow else 0
        while True:
            response = self.send(method, url, body, watchdog)
            if 200 <= response.status < 300:
                return response
            if response.status not in REDIRECTS or not response.location or not hops_left:
                raise HandlerError(API_FAILED, self.failure(response, follow))
            hops_left -= 1
            url = self.redirect_url(url, response)
            if response.status in (302, 303) or (response.status == 301 and method == "POST"):
                method, body = "GET", None

    def send(self, method: str, url: str, body: Any, watchdog: Watchdog) -> _Response:
        """One exchange with the host of ``url``, at an address the policy allows."""
        watchdog.check()
        target = _origin(url)
        # Credentials (configured headers and URL userinfo) go to the configured origin only.
        same_origin = target == _origin(self.config["url"])
        headers = default_headers()
        headers["Accept-Encoding"] = "gzip, deflate"
        if same_origin:
            headers.update(self.config.get("headers") or {})
        headers.update(
            {
                "Idempotency-Key": self.context.occurrence_id,
                "X-Scheduler-Sequence": str(self.context.sequence),
                "X-Scheduler-Attempt": str(self.context.attempt),
            }
        )
        auth = get_auth_from_url(self.config["url"]) if same_origin else ("", "")
        request = requests.Request(
            method, url, headers=headers, json=body, auth=auth if any(auth) else None
        ).prepare()
        if _origin(str(request.url)) != target:
            raise HandlerError(API_FAILED, "The URL cannot be used.")
        _, host, port = target
        try:
            addresses = self.policy.resolve(host, port)
        except AddressRefused as exc:
            raise HandlerError(API_FAILED, str(exc)) from None
        adapter = PinnedAdapter(Route(addresses, watchdog))
        try:
            with adapter.send(request, stream=True, timeout=watchdog.remaining() + 1) as response:
                success = 200 <= response.status_code < 300
                # Past what is shown, enough to see whole any secret that starts before the cut.
                margin = max((len(secret.encode()) for secret in self.secrets), default=0)
                limit = self.max_bytes if success else EXCERPT_BYTES + margin
                kept, size = _read(response, limit, self.keep_bytes + 1 + margin if success else limit)
                # A cut connection can end a body without a length like a complete one.
                watchdog.check()
                if success and size > self.max_bytes:
                    raise HandlerError(
                        API_FAILED, f"The response from {host} is larger than {self.max_bytes} bytes."
                    )
                return _Response(
                    host=host,
                    status=response.status_code,
                    content_type=response.headers.get("Content-Type", ""),
                    encoding=response.encoding,
                    location=response.headers.get("Location"),
                    body=kept,
                    size=size,
                )
        except TRANSPORT_ERRORS as exc:
            watchdog.check()
            raise HandlerError(API_FAILED, _transport_message(exc, host)) from None
        finally:
            adapter.close()

    def redirect_url(self, url: str, response: _Response) -> str:
        location = response.location or ""
        # requests decodes headers as Latin-1; servers send UTF-8 locations.
        with contextlib.suppress(UnicodeError):
            location = location.encode("latin-1").decode("utf-8")
        target = urljoin(url, location)
        if _url_errors(target):
            raise HandlerError(API_FAILED, f"{response.host} redirected to a URL that cannot be used.")
        return target

    def failure(self, response: _Response, follow: bool) -> str:
        """The message of a non-2xx answer, with a short excerpt of its body, secrets scrubbed."""
        if response.status in REDIRECTS and response.location:
            if follow:
                return f"More than {MAX_REDIRECTS} redirects, the last from {response.host}."
            return f"{response.host} answered HTTP {response.status}, a redirect; follow_redirects is off."
        window = " ".join(_decode(response.body, response.encoding).split())
        cut = len(" ".join(_decode(response.body[:EXCERPT_BYTES], response.encoding).split()))
        cut = min(cut, EXCERPT_CHARS)
        excerpt = _shown(window, cut, self.secrets)
        if cut < len(window) or response.size > len(response.body):
            excerpt += "..."
        message = f"{response.host} answered HTTP {response.status}"
        return f"{message}: {excerpt}" if excerpt else f"{message}."


def _shown(text: str, cut: int, secrets: list[str]) -> str:
    """``text[:cut]`` with every secret masked, cut sooner where a secret runs across the cut: no
    part of a secret is ever kept. ``text`` must run past ``cut`` by the longest secret, if it goes on."""
    moved = True
    while moved:
        moved = False
        for secret in secrets:
            start = text.find(secret, max(0, cut - len(secret) + 1))
            if 0 <= start < cut:
                cut, moved = start, True
    shown: str = storable(text[:cut], secrets)
    return shown


def _read(response: requests.Response, limit: int, keep: int) -> tuple[bytes, int]:
    """The first ``keep`` decoded bytes and the decoded size, reading no further than past ``limit``."""
    kept = bytearray()
    size = 0
    for chunk in response.iter_content(CHUNK_BYTES):
        if len(kept) < keep:
            kept += chunk[: keep - len(kept)]
        size += len(chunk)
        if size > limit:
            break
    return bytes(kept), size


def _transport_message(exc: BaseException, host: str) -> str:
    if isinstance(exc, requests.exceptions.SSLError):
        return f"TLS with {host} failed (handshake or certificate)."
    if isinstance(exc, (requests.exceptions.ChunkedEncodingError, requests.exceptions.ContentDecodingError)):
        return f"The response from {host} could not be read."
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError):
            return f"{host} refused the connection."
        cause = cause.__cause__ or cause.__context__
    return f"The connection to {host} failed."


def mask_url(url: str) -> str:
    """The URL with its userinfo password (or a lone user name), query values and fragment masked."""
    if "\\" in url:
        # Its parts cannot be told apart with certainty (a row stored before such URLs were refused).
        return MASK
    try:
        parts = urlsplit(url)
    except ValueError:
        return MASK
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}:{MASK}@{hostport}" if colon else f"{MASK}@{hostport}"
    query = "&".join(
        (f"{name}={MASK}" if equals else MASK) if part else ""
        for part in parts.query.split("&")
        for name, equals, _ in [part.partition("=")]
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, MASK if parts.fragment else ""))


def unmask_url(url: str, stored: str) -> str:
    """``url`` with each part still shown as mask_url shows it taken from ``stored``: the userinfo
    password (or lone user name), query values (by name, in order), the fragment."""
    try:
        parts, old = urlsplit(url), urlsplit(stored)
    except ValueError:
        return url
    netloc = parts.netloc
    if "@" in netloc and "@" in old.netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        old_userinfo = old.netloc.rpartition("@")[0]
        user, colon, password = userinfo.partition(":")
        _, old_colon, old_password = old_userinfo.partition(":")
        if userinfo == MASK and not old_colon:
            userinfo = old_userinfo
        elif colon and password == MASK and old_colon:
            userinfo = f"{user}:{old_password}"
        netloc = f"{userinfo}@{hostport}"
    old_parts = old.query.split("&")
    old_values: dict[str, list[str]] = {}
    for part in old_parts:
        name, equals, value = part.partition("=")
        if equals:
            old_values.setdefault(name, []).append(value)
    query = []
    for i, part in enumerate(parts.query.split("&")):
        name, equals, value = part.partition("=")
        if equals and value == MASK and old_values.get(name):
            part = f"{name}={old_values[name].pop(0)}"
        elif part == MASK and i < len(old_parts) and old_parts[i] and "=" not in old_parts[i]:
            part = old_parts[i]
        query.append(part)
    fragment = old.fragment if parts.fragment == MASK and old.fragment else parts.fragment
    return urlunsplit((parts.scheme, netloc, parts.path, "&".join(query), fragment))


def _same_origin(url: Any, other: Any) -> bool:
    if not (isinstance(url, str) and isinstance(other, str)):
        return False
    try:
        return _origin(url) == _origin(other)
    except (requests.RequestException, ValueError):
        return False


def _masked_parts(url: str) -> bool:
    """Whether ``url`` still holds a part as mask_url shows it: a secret that was not restored."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else None
    if userinfo is not None and (userinfo == MASK or userinfo.partition(":")[2] == MASK):
        return True
    if any(part == MASK or part.partition("=")[2] == MASK for part in parts.query.split("&")):
        return True
    return parts.fragment == MASK


LEFT_MASKED = "*** stands for a stored secret, kept only while the scheme, host and port stay the same: enter the value itself."


def _secrets(config: dict[str, Any]) -> list[str]:
    """Configured values that must never be stored or shown, in the forms a response may echo them:
    header values (and the credentials of a Basic or Bearer one), userinfo, query values; each plain,
    percent-encoded and decoded, and the user and password as a Basic credential."""
    url = config.get("url")
    headers = config.get("headers") or {}
    values = tuple(value for value in headers.values() if isinstance(value, str))
    return list(_secret_forms(url if isinstance(url, str) else "", values))


# An attempt asks twice (the handler for its excerpts and cut bodies, the runner for the outcome).
@functools.lru_cache(maxsize=256)
def _secret_forms(url: str, header_values: tuple[str, ...]) -> tuple[str, ...]:
    values: set[str] = set()
    for value in header_values:
        values.add(value)
        scheme, _, credential = value.partition(" ")
        if scheme.lower() in ("basic", "bearer", "token") and credential:
            values.update({credential, *_basic_parts(credential)})
    query_values: set[str] = set()
    for text in {url, *_sent_forms(url)}:
        parts = urlsplit(text)
        if parts.username or parts.password:
            user, password = unquote(parts.username or ""), unquote(parts.password or "")
            values.update({user, password, parts.username or "", parts.password or ""})
            values.add(base64.b64encode(f"{user}:{password}".encode("latin-1", "replace")).decode())
        for part in parts.query.split("&"):
            value = part.partition("=")[2]
            query_values.update({value, unquote_plus(value)})
        query_values.add(parts.fragment)
    secrets = {value for value in values if len(value) >= MIN_SECRET_LENGTH}
    secrets.update(value for value in query_values if len(value) >= MIN_QUERY_SECRET_LENGTH)
    encoded = {form for value in secrets for form in (quote(value, safe=""), quote_plus(value))}
    # Longest first, so that a secret containing another is masked whole.
    return tuple(sorted(secrets | encoded, key=len, reverse=True))


def _sent_forms(url: str) -> list[str]:
    try:
        return [_prepared(url)]
    except (requests.RequestException, ValueError):
        return []


def _basic_parts(credential: str) -> list[str]:
    """The user and password a Basic credential encodes, when it is one."""
    try:
        user, colon, password = base64.b64decode(credential, validate=True).decode("latin-1").partition(":")
    except (ValueError, UnicodeError):
        return []
    return [user, password] if colon else []


def _url_errors(url: Any) -> list[str]:
    # Messages never repeat the URL: it may carry credentials.
    if not isinstance(url, str):
        return ["Must be a string."]
    if len(url) > MAX_URL_LENGTH:
        return [f"At most {MAX_URL_LENGTH} characters."]
    if any(char.isspace() or not char.isprintable() for char in url):
        return ["Must not contain spaces or control characters."]
    if "\\" in url:
        # Parsers disagree on where the host of a URL with a backslash ends.
        return ["Must not contain a backslash: write it as %5C."]
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError for a bad port)
    except ValueError:
        return ["Must be a valid URL."]
    if parts.scheme.lower() not in SCHEMES:
        return ["Must be an http or https URL."]
    if not parts.hostname:
        return ["Must include a host."]
    if "%" in parts.hostname:
        # An IPv6 zone (fe80::1%eth0) names a network interface of the runner's machine: the
        # address checks and the Host header would each read the host differently.
        return ["Must not name an IPv6 zone (the % part of an address in brackets)."]
    try:
        if not _read_alike(url):
            return ["Must be a URL whose user, host and port read the same to every parser."]
        # Basic authentication sends them as Latin-1, once percent-decoded.
        "".join(get_auth_from_url(url)).encode("latin-1")
    except UnicodeError:
        return ["The user and password must be Latin-1 text once percent-decoded."]
    except (requests.RequestException, ValueError):
        return ["Must be a valid URL."]
    if _masked_parts(url):
        return [LEFT_MASKED]
    return []


def _header_errors(headers: Any) -> list[str]:
    # Messages name the header, never its value.
    if not isinstance(headers, dict):
        return ["Must be an object mapping header names to string values."]
    errors: list[str] = []
    for name, value in headers.items():
        label = short_text(name)
        if not isinstance(name, str) or not HEADER_NAME.match(name):
            errors.append(f"{label} is not a valid header name.")
            continue
        if name.lower() in SCHEDULER_HEADERS or name.lower() in TRANSPORT_HEADERS:
            errors.append(f"{label} is set by the scheduler and cannot be configured.")
        if not isinstance(value, str):
            errors.append(f"The value of {label} must be a string.")
            continue
        if value == MASK:
            errors.append(f"{label}: {LEFT_MASKED}")
            continue
        try:
            check_header_validity((name, value))
            value.encode("latin-1")
        except (InvalidHeader, UnicodeError):
            errors.append(f"The value of {label} must be Latin-1 text without line breaks or leading spaces.")
    return errors


def _prepared(url: str) -> str:
    """The URL as requests sends it (IDNA host, quoted path and query)."""
    request = requests.PreparedRequest()
    request.prepare_url(url, None)
    return str(request.url)


def _origin(url: str) -> tuple[str, str, int]:
    """Where a request for ``url`` goes: scheme, host and port of the URL requests sends.

    The one parse behind unmasking, the same-origin test, the address check and the
    connection; ``_url_errors`` refuses a URL whose text another parser would read otherwise.
    """
    parts = urlsplit(_prepared(url))
    scheme = parts.scheme.lower()
    return scheme, parts.hostname or "", parts.port or (443 if scheme == "https" else 80)


def _read_alike(url: str) -> bool:
    """Whether the URL's text has the userinfo, host and port of the URL requests sends, so
    masking (which edits the text) and the request see the same parts."""
    raw, sent = urlsplit(url), urlsplit(_prepared(url))
    if (raw.scheme.lower(), raw.port) != (sent.scheme, sent.port):
        return False
    if (unquote(raw.username or ""), unquote(raw.password or "")) != (
        unquote(sent.username or ""),
        unquote(sent.password or ""),
    ):
        return False
    host = raw.hostname or ""
    # A non-ASCII host is sent IDNA-encoded; backslashes, the only delimiter the parsers
    # disagree on, are refused before this.
    return not host.isascii() or host == sent.hostname


def _is_json_type(content_type: str) -> bool:
    media = content_type.split(";")[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def _decode(body: bytes, encoding: str | None) -> str:
    try:
        return body.decode(encoding or "utf-8", errors="replace")
    except LookupError:
        return body.decode("utf-8", errors="replace")


def _refuse(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
