"""The API's only parser: JSON with a size limit and strings every database can store."""

from __future__ import annotations

import codecs
import json
import math
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from rest_framework import exceptions, parsers

MAX_BODY_BYTES = 1024 * 1024
MAX_DEPTH = 32
MAX_REPORTED = 20


class JSONParser(parsers.JSONParser):
    """Parse a JSON body of at most MAX_BODY_BYTES; refuse values some database would reject."""

    def parse(
        self, stream: Any, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None
    ) -> Any:
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        raw = stream.read(MAX_BODY_BYTES + 1) if stream is not None else b""
        if len(raw) > MAX_BODY_BYTES:
            raise exceptions.ParseError(f"The request body is larger than {MAX_BODY_BYTES} bytes.")
        try:
            text = codecs.decode(raw, encoding)
            data = json.loads(text, parse_constant=_refuse_constant)
        except (ValueError, LookupError, RecursionError):
            raise exceptions.ParseError("The request body is not valid JSON.") from None
        errors: dict[str, list[str]] = {}
        check_json(data, "", errors)
        if errors:
            raise exceptions.ValidationError(errors)
        return data


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def check_json(value: Any, path: str, errors: dict[str, list[str]], depth: int = 0) -> None:
    """Collect the places in ``value`` that PostgreSQL, MySQL or SQLite could not store as sent.

    NUL characters and unpaired surrogates in strings or keys, numbers that
    are not finite, and nesting deeper than MAX_DEPTH (MySQL stops at 100).
    """
    if len(errors) >= MAX_REPORTED:
        return
    if depth > MAX_DEPTH:
        errors.setdefault(path, []).append(f"Nested too deeply (at most {MAX_DEPTH} levels).")
    elif isinstance(value, str):
        if problem := _text_problem(value):
            errors.setdefault(path, []).append(problem)
    elif isinstance(value, float) and not math.isfinite(value):
        errors.setdefault(path, []).append("Must be a finite number.")
    elif isinstance(value, dict):
        for key, item in value.items():
            name = f"{path}.{_printable(key)}" if path else _printable(key)
            if problem := _text_problem(key):
                errors.setdefault(name, []).append(f"Key: {problem}")
            check_json(item, name, errors, depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_json(item, f"{path}.{index}" if path else str(index), errors, depth + 1)


def _text_problem(text: str) -> str:
    if "\x00" in text:
        return "Must not contain NUL characters."
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "Must not contain unpaired surrogates."
    return ""


def _printable(key: str) -> str:
    return key.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
