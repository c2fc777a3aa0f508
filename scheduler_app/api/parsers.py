"""The API's only parser: JSON with a size limit and values every database can store.

The checks are scheduler_app.definitions', the same as the admin form's and the Python API's.
"""

from __future__ import annotations

import codecs
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from rest_framework import exceptions, parsers

from scheduler_app import definitions

MAX_BODY_BYTES = definitions.MAX_JSON_BYTES
TOO_BIG = f"The request body is larger than {MAX_BODY_BYTES} bytes."


class JSONParser(parsers.JSONParser):
    """Parse a JSON body of at most MAX_BODY_BYTES; refuse values some database would reject."""

    def parse(
        self, stream: Any, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None
    ) -> Any:
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        raw = stream.read(MAX_BODY_BYTES + 1) if stream is not None else b""
        if len(raw) > MAX_BODY_BYTES:
            raise exceptions.ParseError(TOO_BIG)
        try:
            data = definitions.parse_json(codecs.decode(raw, encoding))
        except (ValueError, LookupError):
            raise exceptions.ParseError("The request body is not valid JSON.") from None
        errors: dict[str, list[str]] = {}
        definitions.check_json(data, "", errors)
        if errors:
            raise exceptions.ValidationError(errors)
        return data
