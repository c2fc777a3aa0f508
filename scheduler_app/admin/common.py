"""Pieces the scheduler's admin pages share: the base admin, read-only admins and action reports."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import get_fields_from_path
from django.core.exceptions import BadRequest
from django.db.models.constants import LOOKUP_SEP
from django.http import HttpRequest

from scheduler_app import audit
from scheduler_app.models import ChangeVia

LISTED_NAMES = 10


class SchedulerAdmin(admin.ModelAdmin):
    """The base of every scheduler admin: its list takes only the filters it offers, and no NUL.

    Django accepts a query-string filter on any local field (``?params__token__startswith=...``,
    ``?handler__icontains=...``): counting the rows it matches would reveal, one guess at a
    time, values the pages never show. Only the parameters of ``list_filter``,
    ``date_hierarchy`` and ``linked_lookups`` are accepted; anything else answers 400.
    """

    # Query-string filters other scheduler pages link to, beyond those the list offers.
    linked_lookups: tuple[str, ...] = ()

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        return lookup in self.offered_lookups(request)

    def offered_lookups(self, request: HttpRequest) -> set[str]:
        """The query-string parameters the list's own filters read."""
        offered = set(self.linked_lookups)
        if self.date_hierarchy:
            offered.update(f"{self.date_hierarchy}{LOOKUP_SEP}{part}" for part in ("year", "month", "day"))
        item: Any
        for item in self.get_list_filter(request):
            if isinstance(item, type) and issubclass(item, admin.SimpleListFilter):
                offered.add(str(item.parameter_name))
                continue
            if isinstance(item, type) and issubclass(item, admin.ListFilter):
                spec = item(request, {}, self.model, self)
            else:
                path, filter_class = (
                    item if isinstance(item, (list, tuple)) else (item, admin.FieldListFilter.create)
                )
                field = get_fields_from_path(self.model, path)[-1]
                spec = filter_class(field, request, {}, self.model, self, field_path=path)
            offered.update(str(name) for name in spec.expected_parameters() if name)
        return offered

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        # PostgreSQL refuses to compare text with NUL: a filter, search or selection holding one
        # would be a 500.
        for query in (request.GET, request.POST):
            if any("\x00" in "".join((key, *values)) for key, values in query.lists()):
                raise BadRequest("NUL characters in the request.")
        return super().changelist_view(request, extra_context)

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        # No key holds a NUL: the object is missing, as Django says of any other id that cannot exist.
        if "\x00" in object_id:
            return None
        return super().get_object(request, object_id, from_field)


class ReadOnlyAdmin(SchedulerAdmin):
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


def acting(request: HttpRequest) -> AbstractContextManager[None]:
    """Task changes made inside are recorded in the audit trail as this admin user's."""
    return audit.acting(actor(request), via=ChangeVia.ADMIN)


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
