"""The transaction port: what the queue needs of a caller's transaction."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Tx(Protocol):
    """A transaction the queue can write through; psycopg never appears here."""

    def execute(self, query: Any, params: Any = None) -> Any: ...
