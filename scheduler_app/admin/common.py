"""Pieces the scheduler's admin pages share: read-only admins, secret columns and action reports."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.contrib import admin
from django.db.models.constants import LOOKUP_SEP
from django.http import HttpRequest

LISTED_NAMES = 10


class SecretFieldsAdmin(admin.ModelAdmin):
    """An admin whose list refuses query-string filters on ``secret_fields``.

    Django accepts a filter on any local field (``?handler__icontains=...``);
    counting the rows it matches would reveal a secret one guess at a time.
    """

    secret_fields: tuple[str, ...] = ()

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        if lookup.split(LOOKUP_SEP)[0] in self.secret_fields:
            return False
        return super().lookup_allowed(lookup, value, request)


class ReadOnlyAdmin(SecretFieldsAdmin):
    """An admin for rows only the scheduler writes: no add, change or delete."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def actor(request: HttpRequest) -> str:
    """Who acts: the admin user's name, recorded as trigger source or event node."""
    return str(request.user.get_username())


def names(items: Sequence[str]) -> str:
    """The first few names of a list, then how many more."""
    shown = ", ".join(items[:LISTED_NAMES])
    if len(items) > LISTED_NAMES:
        shown += f" and {len(items) - LISTED_NAMES} more"
    return shown


def tell(
    modeladmin: admin.ModelAdmin,
    request: HttpRequest,
    text: str,
    items: Sequence[str],
    level: int,
    **values: str,
) -> None:
    """Send one action message (already chosen with ngettext) when it concerns any row.

    ``values`` fill the message's other placeholders, so the message id stays one string.
    """
    if items:
        modeladmin.message_user(request, text % {**values, "count": len(items), "items": names(items)}, level)
