"""What the sync Store and the AsyncStore check alike before they touch the database."""

from __future__ import annotations

from typing import Any

from brooq_py.queue import BrooqError


def check_schema(schema: Any) -> str:
    """Return *schema*, or raise ValueError for anything but non-empty text without NUL."""
    if not isinstance(schema, str) or not schema or "\x00" in schema:
        raise ValueError(f"invalid schema name: {schema!r}")
    return schema


def no_pool(store: str, doing: str) -> BrooqError:
    """Return the error of a producer-only store (built without a pool) asked to use one."""
    return BrooqError(
        f"{store} was built without a pool ({store}(None, ...)), so it cannot do this ({doing}): "
        "it only enqueues inside your own transactions (enqueue_tx, enqueue_many(tx=...)); "
        f"give {store} a pool for the rest"
    )
