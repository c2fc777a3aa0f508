"""What an outcome may store: the handler's secrets masked, and text every database accepts.

A handler's result and error reach the execution, its events and its log rows,
which anyone allowed to view executions reads. ``storable`` is applied to every
outcome before it is written: each configured secret (in every form the handler
lists: plain, percent-encoded, base64) becomes ``***``, in values and in object
keys alike, and NUL and lone surrogates (which PostgreSQL refuses in text and
JSON, and no UTF-8 encoder can write) become U+FFFD.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

MASK = "***"
REPLACEMENT = "\ufffd"
_UNWRITABLE = re.compile("[\x00\ud800-\udfff]")


def storable(value: Any, secrets: Iterable[str] = ()) -> Any:
    """``value`` (JSON-like) with every string scrubbed of ``secrets`` and of unwritable characters.

    Values that are not JSON are returned as they are, for the caller's JSON check to refuse.
    Raises RecursionError for a value nested too deep to walk.
    """
    # Longest first, so that a secret containing another is masked whole.
    ordered = sorted({secret for secret in secrets if secret}, key=len, reverse=True)
    return _walk(value, ordered)


def _walk(value: Any, secrets: list[str]) -> Any:
    if isinstance(value, str):
        for secret in secrets:
            if secret in value:
                value = value.replace(secret, MASK)
        return _UNWRITABLE.sub(REPLACEMENT, value)
    if isinstance(value, dict):
        return {_walk(key, secrets): _walk(item, secrets) for key, item in value.items()}
    if isinstance(value, list):
        return [_walk(item, secrets) for item in value]
    return value
