"""Small tests and renderings of user-given values, shared by definitions, handlers and checks."""

from __future__ import annotations

from typing import Any, TypeGuard


def short_text(value: Any) -> str:
    """A value as error messages quote it: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def is_int(value: Any) -> TypeGuard[int]:
    """An int that is not a bool (JSON's true is not 1 here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> TypeGuard[int | float]:
    """An int or float that is not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
