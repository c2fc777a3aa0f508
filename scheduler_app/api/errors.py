"""The one exception handler of the API: every error becomes ``{"code", "message", "fields"?}``.

SchedulerError subclasses keep their stable codes. Errors raised by DRF
itself (authentication, permissions, parsing, methods) keep DRF's codes,
except input errors, which share InvalidDefinition's code. Anything else is
logged with a correlation id and answered with a generic 500: no SQL, driver
message or stack trace ever reaches a response.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import set_rollback

from scheduler_app.api.parsers import TOO_BIG
from scheduler_app.exceptions import (
    Conflict,
    ExecutionNotFound,
    InvalidDefinition,
    InvalidState,
    SchedulerError,
    StorageError,
    TaskAlreadyExists,
    TaskNotFound,
)

logger = logging.getLogger("scheduler_app.api")

INPUT_ERROR_CODE = InvalidDefinition.code
SERVER_ERROR_CODE = "server_error"

STATUS_BY_ERROR: tuple[tuple[type[SchedulerError], int], ...] = (
    (InvalidDefinition, status.HTTP_400_BAD_REQUEST),
    (TaskNotFound, status.HTTP_404_NOT_FOUND),
    (ExecutionNotFound, status.HTTP_404_NOT_FOUND),
    (TaskAlreadyExists, status.HTTP_409_CONFLICT),
    (Conflict, status.HTTP_409_CONFLICT),
    (InvalidState, status.HTTP_409_CONFLICT),
    (StorageError, status.HTTP_503_SERVICE_UNAVAILABLE),
)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    """Map ``exc`` to a JSON error response; the request's transaction is rolled back."""
    set_rollback()
    if isinstance(exc, SchedulerError):
        return _scheduler_error(exc)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    elif isinstance(exc, RequestDataTooBig):
        # Past DATA_UPLOAD_MAX_MEMORY_SIZE Django refuses to read the body before the parser can.
        exc = exceptions.ParseError(TOO_BIG)
    if isinstance(exc, exceptions.ValidationError):
        return error_response(
            status.HTTP_400_BAD_REQUEST, INPUT_ERROR_CODE, "The request is invalid.", flatten(exc.detail)
        )
    if isinstance(exc, exceptions.ParseError):
        return error_response(status.HTTP_400_BAD_REQUEST, INPUT_ERROR_CODE, str(exc.detail))
    if isinstance(exc, exceptions.APIException):
        response = error_response(exc.status_code, str(exc.default_code), str(exc.detail))
        if getattr(exc, "auth_header", None):
            response["WWW-Authenticate"] = exc.auth_header  # type: ignore[attr-defined]
        if getattr(exc, "wait", None):
            response["Retry-After"] = str(int(exc.wait))  # type: ignore[attr-defined]
        return response
    return server_error(exc)


def _scheduler_error(exc: SchedulerError) -> Response:
    code = next((code for cls, code in STATUS_BY_ERROR if isinstance(exc, cls)), 500)
    if code >= 500:
        return server_error(exc, code=code, error_code=exc.code, message=exc.message)
    fields = exc.errors if isinstance(exc, InvalidDefinition) else None
    return error_response(code, exc.code, exc.message, fields)


def server_error(
    exc: BaseException,
    *,
    code: int = status.HTTP_500_INTERNAL_SERVER_ERROR,
    error_code: str = SERVER_ERROR_CODE,
    message: str = "Internal error.",
) -> Response:
    """A generic error whose details go to the server log only, under a correlation id."""
    correlation_id = uuid.uuid4().hex
    logger.error("API request failed, correlation id %s", correlation_id, exc_info=exc)
    response = error_response(code, error_code, f"{message} Correlation id: {correlation_id}.")
    response.data["correlation_id"] = correlation_id
    return response


def error_response(
    code: int, error_code: str, message: str, fields: dict[str, list[str]] | None = None
) -> Response:
    data: dict[str, Any] = {"code": error_code, "message": message}
    if fields:
        data["fields"] = fields
    return Response(data, status=code)


def flatten(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """DRF's nested error detail as ``{"dotted.field": [messages]}``; ``""`` is the object itself."""
    fields: dict[str, list[str]] = {}
    if isinstance(detail, dict):
        for key, value in detail.items():
            name = "" if key == "non_field_errors" else str(key)
            for field, messages in flatten(
                value, f"{prefix}.{name}" if prefix and name else prefix or name
            ).items():
                fields.setdefault(field, []).extend(messages)
    elif isinstance(detail, list) and any(isinstance(item, (dict, list)) for item in detail):
        for index, item in enumerate(detail):
            for field, messages in flatten(item, f"{prefix}.{index}" if prefix else str(index)).items():
                fields.setdefault(field, []).extend(messages)
    elif isinstance(detail, list):
        fields.setdefault(prefix, []).extend(str(item) for item in detail)
    else:
        fields.setdefault(prefix, []).append(str(detail))
    return fields
