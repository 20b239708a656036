"""Completer: batches plain outcome writes into one guarded statement (SPEC C10)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from brooq_py.engine.repo import Outcome

MAX_BATCH = 1000
# An outcome whose row was locked elsewhere is written again after this long, on its own (L3').
LOCKED_RETRY = 0.25


class Completer:
    """Buffers outcomes and flushes them with ``write(batch)`` on its own thread.

    It flushes *linger* seconds after an outcome arrives (or at once when a
    batch is full), and batches grow by themselves under load. A full
    buffer (``max_buffer``) makes ``put`` wait: back-pressure on the slots.
    A failed flush is logged and retried with backoff; the outcomes stay
    buffered (their leases are still renewed until a flush ends them) while
    ``keep(outcome)`` says their lease is still held; the others go to
    ``on_dropped`` (SPEC L6: a failed write is never the job's failure).
    ``on_written(batch, written_ids)`` runs after every successful flush. An outcome
    whose row another transaction held locked (the write's ``locked`` claim tokens)
    is kept aside and written again LOCKED_RETRY later: it waits alone, never
    holding up the others (SPEC L3').
    """

    name = "completer"

    def __init__(
        self,
        write: Callable[[Sequence[Outcome]], set[str]],
        on_written: Callable[[Sequence[Outcome], set[str]], None],
        log: logging.Logger,
        *,
        max_buffer: int = 5000,
        max_batch: int = MAX_BATCH,
        linger: float = 0.0,
        keep: Callable[[Outcome], bool] | None = None,
        on_dropped: Callable[[Sequence[Outcome]], None] | None = None,
    ) -> None:
        self._write = write
        self._on_written = on_written
        self._log = log
        self._max_buffer = max_buffer
        self._max_batch = max_batch
        self._linger = linger
        self._keep = keep
        self._on_dropped = on_dropped
        self._buf: list[Outcome] = []
        self._later: list[Outcome] = []  # rows locked elsewhere: retried at _later_at
        self._later_at = 0.0
        self._retrying: set[str] = set()  # claim tokens of outcomes set aside, back in the buffer
        self._inflight = 0
        self._cond = threading.Condition()
        self._stopping = False
        self._idle = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        with self._cond:
            if self._thread is not None:
                return
            self._stopping = False
            self._thread = threading.Thread(target=self._loop, name="brooq-completer", daemon=True)
            self._thread.start()

    def put(self, outcome: Outcome) -> bool:
        """Buffer *outcome* for the next flush; False once ``stop()`` began: the caller writes it."""
        with self._cond:
            if self._stopping and self._thread is None:
                return False
            while len(self._buf) >= self._max_buffer and self._thread is not None and not self._stopping:
                self._cond.wait(0.5)
            self._buf.append(outcome)
            # Wake the writer only when it sleeps on an empty buffer or a batch is full: while
            # it lingers, more outcomes joining need no wake-up (one context switch less a job).
            if self._idle or len(self._buf) >= self._max_batch:
                self._cond.notify_all()
            return True

    def has_room(self) -> bool:
        """Whether ``offer`` would take an outcome now (running, buffer not full)."""
        with self._cond:
            return self._thread is not None and not self._stopping and len(self._buf) < self._max_buffer

    def offer(self, outcome: Outcome) -> bool:
        """``put`` without waiting: False when stopping or the buffer is full (nothing buffered)."""
        with self._cond:
            if self._thread is None or self._stopping or len(self._buf) >= self._max_buffer:
                return False
            self._buf.append(outcome)
            if self._idle or len(self._buf) >= self._max_batch:
                self._cond.notify_all()
            return True

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._buf) + len(self._later) + self._inflight

    def flush_once(self) -> int:
        """Write what is buffered now, in this thread (for tests and stop); return how many."""
        with self._cond:
            batch, self._buf = self._buf, []
            self._inflight += len(batch)
        # Outcomes set aside for a row locked elsewhere are written in a part of their own, last,
        # so that meeting the lock again costs the others nothing (L3').
        again = [o for o in batch if o.claim_token in self._retrying]
        rest = [o for o in batch if o.claim_token not in self._retrying] if again else batch
        parts = [rest[i : i + self._max_batch] for i in range(0, len(rest), self._max_batch)]
        if again:
            parts.append(again)  # last: the others are written before it meets the lock again
            batch = rest + again
        try:
            done = 0
            for part in parts:
                written = self._write(part)
                done += len(part)
                locked = getattr(written, "locked", None)
                self._retrying.difference_update(o.claim_token for o in part)
                if locked:
                    self._set_aside([o for o in part if o.claim_token in locked])
                    part = [o for o in part if o.claim_token not in locked]
                try:
                    self._on_written(part, written)
                except Exception:  # the rows are written: bookkeeping errors must not rewrite them
                    self._log.exception("completer: after-write bookkeeping failed")
            return done
        except BaseException:
            with self._cond:
                self._buf[:0] = batch[done:]
            raise
        finally:
            with self._cond:
                self._inflight -= len(batch)
                self._cond.notify_all()

    def _set_aside(self, outcomes: list[Outcome]) -> None:
        with self._cond:
            if not self._later:
                self._later_at = time.monotonic() + LOCKED_RETRY
            self._later.extend(outcomes)

    def _due_later(self) -> float | None:
        """Move the outcomes set aside into the buffer once due (lock held); else seconds until they are."""
        if not self._later:
            return None
        left = self._later_at - time.monotonic()
        if left > 0:
            return left
        self._buf.extend(self._later)
        self._retrying.update(o.claim_token for o in self._later)
        self._later = []
        return None

    def _loop(self) -> None:
        failures = 0
        while True:
            with self._cond:
                self._idle = True
                while not self._stopping:
                    left = self._due_later()
                    if self._buf:
                        break
                    self._cond.wait(left)
                self._idle = False
                if not self._buf and self._stopping:
                    return
                # A moment for more outcomes to join: fewer, larger writes leave the
                # database more room for the claims (measured +10% at 4 workers).
                until = time.monotonic() + self._linger
                while not self._stopping and len(self._buf) < self._max_batch:
                    left = until - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
            try:
                self.flush_once()
                failures = 0
            except Exception as exc:
                failures += 1
                delay = min(0.05 * 2**failures, 5.0)
                self._log.warning(
                    "completer: writing outcomes failed (%s); retrying in %.2fs", type(exc).__name__, delay
                )
                self._drop_lost()
                with self._cond:
                    if self._stopping and failures > 3:
                        return  # stop() reports what could not be written
                time.sleep(delay)

    def _drop_lost(self) -> None:
        """Give up on buffered outcomes whose lease is no longer held (the reaper returns those jobs)."""
        if self._keep is None:
            return
        with self._cond:
            kept: list[Outcome] = []
            dropped: list[Outcome] = []
            for o in self._buf:
                (kept if self._keep(o) else dropped).append(o)
            self._buf = kept
            self._cond.notify_all()
        if dropped and self._on_dropped is not None:
            try:
                self._on_dropped(dropped)
            except Exception:
                self._log.exception("completer: bookkeeping of dropped outcomes failed")

    def stop(self, timeout: float = 10.0) -> int:
        """Flush what is buffered, stop the thread; return how many outcomes stay unwritten."""
        with self._cond:
            thread, self._thread = self._thread, None
            self._stopping = True
            self._cond.notify_all()
        if thread is not None:
            thread.join(timeout)
        with self._cond:
            self._buf.extend(self._later)  # rows still locked elsewhere get one more try
            self._later = []
            left = len(self._buf)
        if left:
            try:
                self.flush_once()
            except Exception as exc:
                self._log.error("completer: %d outcomes could not be written at stop: %s", left, exc)
        return self.pending
