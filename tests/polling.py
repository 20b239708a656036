"""Polling for a condition with a generous deadline: tests wait on state, never on fixed sleeps."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(
    cond: Callable[[], Any], what: str = "condition", timeout: float = 30.0, interval: float = 0.01
) -> Any:
    """Poll *cond* until it returns something truthy and return it; fail naming *what* after *timeout* s."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)
