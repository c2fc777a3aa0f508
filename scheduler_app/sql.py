"""SQL text the code writes itself, from its own constants."""

from __future__ import annotations


def status_literal(*statuses: str) -> str:
    """Statuses as SQL text, one literal or a parenthesised list.

    For conditions on status in statements of fixed text: the values are constants of
    the code, and written into the text they let a prepared statement's generic plan
    use the journal's partial indexes (scheduler_app/indexes.py) and know how few rows
    match, where parameters would hide both (and keep PostgreSQL planning every call).
    """
    assert statuses and all(status.isalpha() for status in statuses)
    if len(statuses) == 1:
        return f"'{statuses[0]}'"
    return "(" + ", ".join(f"'{status}'" for status in statuses) + ")"
