"""OutcomeSink: where the runner hands a plain outcome to be written (SPEC C10).

The completer (``engine.services.completer``) is the one implementation; the
engine plugs it into the runner at start. The port is declared here, on the
attempt's side, so that the attempt's modules never import a service.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from brooq_py.queue.job import EventKind
from brooq_py.queue.port import Outcome


class OutcomeSink(Protocol):
    """Takes outcomes to write later, in a batch; see ``Completer`` for the rules."""

    def has_room(self) -> bool:
        """Whether ``offer`` would take an outcome now."""
        ...

    def offer(self, outcome: Outcome) -> bool:
        """Take *outcome* without waiting; False when it cannot (nothing taken)."""
        ...

    def put(self, outcome: Outcome) -> bool:
        """Take *outcome*, waiting for room; False once stopping: the caller writes it."""
        ...

    def retry(self, fn: Callable[[], bool], give_up: Callable[[], None]) -> bool:
        """Call *fn* again later, from the same queue, until it answers True; *give_up* if the
        engine stops first. False once stopping (nothing taken: the caller tries in place)."""
        ...


class EventSink(Protocol):
    """Takes events to deliver after their commit (``services.events.EventBus``, SPEC N1)."""

    @property
    def active(self) -> bool:
        """Whether any listener is registered (no event is built otherwise)."""
        ...

    def emit(self, kind: EventKind, job_id: str, topic: str, attempt: int, error: str | None = None) -> None:
        """Queue one event; never blocks, never raises."""
        ...
