"""Indexes the hot paths pay for: partial ones where the database can plan with them (PostgreSQL), and
none that only a LIKE on a prefix of the task id would read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import models
from django.db.migrations.operations.base import Operation


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


class WithoutPatternIndex(Operation):
    """Drop the second index Django's PostgreSQL backend builds beside a varchar primary key, for
    ``LIKE 'prefix%'`` outside the C locale (varchar_pattern_ops).

    Nothing here filters task ids by a prefix (the admin's search matches anywhere in the id, which
    no B-tree serves), and every change of next_run_at, a new row version at each fire time, wrote an
    entry into it (bench/scale.py counted its blocks among a burst's reads). Other databases build
    no such index.
    """

    reversible = True

    def __init__(self, model_name: str, field_name: str) -> None:
        self.model_name = model_name
        self.field_name = field_name

    def deconstruct(self) -> tuple[str, Sequence[Any], dict[str, Any]]:
        return self.__class__.__name__, [self.model_name, self.field_name], {}

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return
        model = to_state.apps.get_model(app_label, self.model_name)
        column = model._meta.get_field(self.field_name).column
        name = schema_editor._create_index_name(model._meta.db_table, [column], suffix="_like")
        # Deferred, as CreateModel defers the index's creation to the end of the migration.
        schema_editor.deferred_sql.append(f"DROP INDEX IF EXISTS {schema_editor.quote_name(name)}")

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return
        model = to_state.apps.get_model(app_label, self.model_name)
        statement = schema_editor._create_like_index_sql(model, model._meta.get_field(self.field_name))
        if statement is not None:
            schema_editor.execute(statement)

    def describe(self) -> str:
        return f"Drop the LIKE-prefix index of {self.model_name}.{self.field_name} on PostgreSQL"


class PostgresOnlyIndex(Operation):
    """An index built on PostgreSQL only, for statements that only PostgreSQL runs
    (scheduler_app/postgres/): elsewhere their ORM counterparts would not read it, and a whole
    index there would be one more entry to write for every row of the journal.

    Not in the model's Meta, so that Django's migration state, which has no notion of a
    database-specific index, never asks to build it elsewhere.
    """

    reversible = True

    def __init__(self, model_name: str, index: models.Index) -> None:
        self.model_name = model_name
        self.index = index

    def deconstruct(self) -> tuple[str, Sequence[Any], dict[str, Any]]:
        return self.__class__.__name__, [self.model_name, self.index], {}

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor == "postgresql":
            model = to_state.apps.get_model(app_label, self.model_name)
            schema_editor.execute(self.index.create_sql(model, schema_editor), params=None)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor == "postgresql":
            model = from_state.apps.get_model(app_label, self.model_name)
            schema_editor.execute(self.index.remove_sql(model, schema_editor))

    def describe(self) -> str:
        return f"Create index {self.index.name} on {self.model_name} on PostgreSQL"
