"""OpenAPI annotations that work with or without the optional drf-spectacular.

Install ``django-scheduler-app[openapi]`` to serve the schema at ``schema/``;
without it the decorators here change nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.util import find_spec
from typing import Any, TypeVar

from rest_framework.schemas.inspectors import DefaultSchema

T = TypeVar("T")

HAS_SPECTACULAR = find_spec("drf_spectacular") is not None
# Swagger UI's files, for the offline docs page at schema/docs/ (the openapi extra installs both).
HAS_SIDECAR = find_spec("drf_spectacular_sidecar") is not None


def document(**kwargs: Any) -> Callable[[T], T]:
    """``extend_schema(**kwargs)`` when drf-spectacular is installed, else nothing."""
    if not HAS_SPECTACULAR:
        return _unchanged
    from drf_spectacular.openapi import AutoSchema
    from drf_spectacular.utils import extend_schema

    def decorate(method: T) -> T:
        # extend_schema extends the host's DEFAULT_SCHEMA_CLASS unless the method names its own.
        if not hasattr(method, "kwargs"):
            method.kwargs = {}  # type: ignore[attr-defined]
        method.kwargs.setdefault("schema", AutoSchema)  # type: ignore[attr-defined]
        return extend_schema(**kwargs)(method)  # type: ignore[type-var]

    return decorate


def document_field(spec: dict[str, Any]) -> Callable[[T], T]:
    """``extend_schema_field(spec)`` when drf-spectacular is installed, else nothing."""
    if not HAS_SPECTACULAR:
        return _unchanged
    from drf_spectacular.utils import extend_schema_field

    return extend_schema_field(spec)  # type: ignore[return-value]


def one_object(serializer: T) -> T:
    """``extend_schema_serializer(many=False)``: a list action that answers one object (a page), not
    an array; nothing without drf-spectacular."""
    if not HAS_SPECTACULAR:
        return serializer
    from drf_spectacular.utils import extend_schema_serializer

    return extend_schema_serializer(many=False)(serializer)  # type: ignore[type-var]


def described(serializer: Any, description: str) -> Any:
    """A response with its description (an OpenApiResponse), or the bare serializer."""
    if not HAS_SPECTACULAR:
        return serializer
    from drf_spectacular.utils import OpenApiResponse

    return OpenApiResponse(response=serializer, description=description)


def example(name: str, value: Any) -> list[Any]:
    """A request example for ``document(examples=...)``; none without drf-spectacular."""
    if not HAS_SPECTACULAR:
        return []
    from drf_spectacular.utils import OpenApiExample

    return [OpenApiExample(name, value=value, request_only=True)]


def auto_schema() -> Any:
    """The inspector of the API's views: drf-spectacular's whatever the host's DEFAULT_SCHEMA_CLASS."""
    if not HAS_SPECTACULAR:
        return DefaultSchema()
    from drf_spectacular.openapi import AutoSchema

    return AutoSchema()


def _unchanged(target: T) -> T:
    return target
