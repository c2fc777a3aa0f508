from __future__ import annotations

import pytest

from tests import hooks


@pytest.fixture(autouse=True)
def _clear_hook_calls() -> None:
    hooks.CALLS.clear()
