"""An index of the rows a hot query reads, on the database that can plan with one (PostgreSQL)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import models


class PartialIndex(models.Index):
    """An index of the rows matching ``where`` on PostgreSQL, of every row on other databases.

    A journal row changes status three times in its life and each change writes a new entry
    into every index of the table that covers the new row. An index of the pending rows, or
    of the leased ones, gets no entry for the others: it stays as small as the queue instead
    of growing with the history, and the writes of a busy runner touch fewer pages
    (bench/floor.py: several times the executions per second). Queries that should use one
    name their statuses as literals, so that a prepared statement's plan can use it too.

    SQLite plans a partial index only for queries whose terms repeat its condition, MySQL and
    MariaDB have none: they keep the whole index, as before, and ``condition`` stays None so
    that Django does not warn that it is ignored there (models.W037).
    """

    def __init__(self, *, where: models.Q, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.where = where

    def deconstruct(self) -> tuple[str, Sequence[Any], dict[str, Any]]:
        path, args, kwargs = super().deconstruct()
        return path, args, {**kwargs, "where": self.where}

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        condition = self.where if schema_editor.connection.vendor == "postgresql" else None
        index = models.Index(fields=self.fields, name=self.name, condition=condition)
        return index.create_sql(model, schema_editor, using, **kwargs)
