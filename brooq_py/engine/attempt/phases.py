"""The attempt's two state machines as tables: its phase (how it ended) and its handler's life (SPEC L1).

``attempt.Attempt`` moves through them; ``outcome.decide`` reads the ending. They live
apart from both so that ``decide`` and the Attempt, which asks it, import each other
in one direction only.
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    CLAIMED = "claimed"
    RUNNING = "running"
    RETURNED = "returned"  # the handler returned: the only ending that can close done (L1)
    RAISED = "raised"
    HUNG = "hung"  # still running watchdog_grace after its ctx was cancelled (C5)
    LOST = "lost"  # the heartbeat found the row no longer this claim's (C3)
    GAVE_UP = "gave_up"  # max_execution_timeout (C4)
    FENCED = "fenced"  # renewals failed for a whole lease (L4)
    POISONED = "poisoned"  # claimed with attempts past max_attempts: never run (L5)
    UNRUN = "unrun"  # claimed while the engine stopped: handed back unrun
    SETTLING = "settling"
    SETTLED = "settled"


class HandlerState(StrEnum):
    RUNNING = "running"
    ENDED = "ended"
    ABANDONED = "abandoned"  # the engine stopped waiting (gave up); not hung yet
    HUNG = "hung"


ENDINGS = frozenset(
    {
        Phase.RETURNED,
        Phase.RAISED,
        Phase.HUNG,
        Phase.LOST,
        Phase.GAVE_UP,
        Phase.FENCED,
        Phase.POISONED,
        Phase.UNRUN,
    }
)

PHASES: dict[Phase, frozenset[Phase]] = {
    Phase.CLAIMED: frozenset({Phase.RUNNING, Phase.POISONED, Phase.UNRUN}),
    Phase.RUNNING: frozenset(ENDINGS - {Phase.POISONED, Phase.UNRUN}),
    **{e: frozenset({Phase.SETTLING}) for e in ENDINGS},
    Phase.SETTLING: frozenset({Phase.SETTLED}),
    Phase.SETTLED: frozenset(),
}

HANDLER: dict[HandlerState, frozenset[HandlerState]] = {
    HandlerState.RUNNING: frozenset({HandlerState.ENDED, HandlerState.ABANDONED, HandlerState.HUNG}),
    HandlerState.ABANDONED: frozenset({HandlerState.ENDED, HandlerState.HUNG}),
    HandlerState.HUNG: frozenset({HandlerState.ENDED}),
    HandlerState.ENDED: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A move the attempt's tables do not allow: a bug in the engine."""
