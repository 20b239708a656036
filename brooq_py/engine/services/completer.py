"""Completer: every outcome is written from its queue, in batches of one guarded statement (SPEC C10, L6, O4)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from brooq_py.queue.port import Outcome

MAX_BATCH = 1000
# An outcome whose row was locked elsewhere is written again after this long, on its own.
LOCKED_RETRY = 0.25
# A closing transaction tried again waits this long first, doubling up to RETRY_MAX.
RETRY_FIRST = 0.05
RETRY_MAX = 2.0


class Completer:
    """Buffers outcomes and flushes them on its own thread, *linger* seconds after one arrives; a full
    buffer makes ``put`` wait (back-pressure on the slots), a failed flush keeps its outcomes for the
    retry, and one whose row was locked elsewhere is written again later, alone."""

    def __init__(
        self,
        write: Callable[[Sequence[Outcome]], set[str]],
        on_written: Callable[[Sequence[Outcome], set[str]], None],
        log: logging.Logger,
        *,
        max_buffer: int = 5000,
        linger: float = 0.0,
    ) -> None:
        self._write = write
        self._on_written = on_written
        self._log = log
        self._max_buffer = max_buffer
        self._linger = linger
        self._buf: list[Outcome] = []
        self._later: list[Outcome] = []  # rows locked elsewhere: retried at _later_at
        self._later_at = 0.0
        self._retrying: set[str] = set()  # claim tokens of outcomes set aside, back in the buffer
        # Closing transactions to try again: (when, next wait, try, abandon).
        self._again: list[tuple[float, float, Callable[[], bool], Callable[[], None]]] = []
        self._writing = 0
        self._cond = threading.Condition()
        self._stopping = False
        self._abandoned = False
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
        """Buffer *outcome*, waiting for room; False once ``stop()`` began (the caller writes it)."""
        return self.put_many((outcome,))

    def put_many(self, outcomes: Sequence[Outcome]) -> bool:
        """``put`` for several outcomes, so that one flush takes them together."""
        with self._cond:
            if self._stopping and self._thread is None:
                return False
            while len(self._buf) >= self._max_buffer and self._thread is not None and not self._stopping:
                self._cond.wait(0.5)
            for outcome in outcomes:
                self._buffer(outcome)
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
            self._buffer(outcome)
            return True

    def _buffer(self, outcome: Outcome) -> None:
        self._buf.append(outcome)
        # wake the writer only when idle or a batch is full: lingering, it needs no context switch
        if self._idle or len(self._buf) >= MAX_BATCH:
            self._cond.notify_all()

    def retry(self, fn: Callable[[], bool], abandon: Callable[[], None]) -> bool:
        """Call *fn* on this thread with backoff until it answers True, *abandon* if stopped first;
        False once stopping."""
        with self._cond:
            if self._thread is None or self._stopping:
                return False
            self._again.append((time.monotonic() + RETRY_FIRST, RETRY_FIRST, fn, abandon))
            self._cond.notify_all()
            return True

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._buf) + len(self._later) + self._writing + len(self._again)

    def _try_again(self) -> None:
        """Run the closing transactions whose time came; those that answer False wait longer."""
        now = time.monotonic()
        with self._cond:
            due = [r for r in self._again if r[0] <= now]
            if not due:
                return
            self._again = [r for r in self._again if r[0] > now]
        for _, wait, fn, abandon in due:
            if not self._tried(fn, log=True):
                with self._cond:
                    self._again.append((time.monotonic() + wait, min(wait * 2, RETRY_MAX), fn, abandon))

    def _tried(self, fn: Callable[[], bool], log: bool) -> bool:
        """Whether one try of a closing transaction finished it."""
        try:
            return fn()
        except Exception:
            if log:
                self._log.exception("completer: a closing transaction tried again failed")
            return False

    def flush_once(self) -> int:
        """Write what is buffered now, in this thread (for tests and stop); return how many."""
        with self._cond:
            batch, self._buf = self._buf, []
            self._writing += len(batch)
        # outcomes set aside for a locked row go last, alone: meeting the lock again costs others nothing
        again = [o for o in batch if o.claim_token in self._retrying]
        rest = [o for o in batch if o.claim_token not in self._retrying] if again else batch
        parts = [rest[i : i + MAX_BATCH] for i in range(0, len(rest), MAX_BATCH)]
        if again:
            parts.append(again)
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
                self._writing -= len(batch)
                self._cond.notify_all()

    def _set_aside(self, outcomes: list[Outcome]) -> None:
        with self._cond:
            if not self._later:
                self._later_at = time.monotonic() + LOCKED_RETRY
            self._later.extend(outcomes)

    def _due_later(self) -> float | None:
        """Move the outcomes set aside into the buffer once due (lock held); else seconds until
        they or a closing transaction to try again are due."""
        waits = [r[0] - time.monotonic() for r in self._again]
        if self._later:
            left = self._later_at - time.monotonic()
            if left <= 0:
                self._buf.extend(self._later)
                self._retrying.update(o.claim_token for o in self._later)
                self._later = []
            else:
                waits.append(left)
        return max(0.0, min(waits)) if waits else None

    def _loop(self) -> None:
        failures = 0
        while True:
            with self._cond:
                self._idle = True
                while True:
                    left = self._due_later()
                    if self._buf or left == 0.0:
                        break
                    if self._stopping and (not self._again or self._abandoned):
                        return
                    self._cond.wait(left)
                self._idle = False
                due_again = not self._buf
            if due_again:
                self._try_again()
                continue
            with self._cond:
                # fewer, larger writes leave the database more room for the claims (+10% at 4 workers)
                until = time.monotonic() + self._linger
                while not self._stopping and len(self._buf) < MAX_BATCH:
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
                with self._cond:
                    if self._stopping and (failures > 3 or self._abandoned):
                        return  # stop() reports what could not be written
                time.sleep(delay)
            self._try_again()

    def stop(self, timeout: float = 10.0) -> int:
        """Flush and try the waiting closing transactions for up to *timeout* seconds; return how many
        outcomes stay unwritten."""
        with self._cond:
            thread, self._thread = self._thread, None
            self._stopping = True
            self._cond.notify_all()
        if thread is not None:
            thread.join(timeout)
        with self._cond:
            self._abandoned = True  # a thread still in a write ends after it
            self._buf.extend(self._later)  # rows still locked elsewhere get one more try
            self._later = []
            left = len(self._buf)
            again, self._again = self._again, []
        if left:
            try:
                self.flush_once()
            except Exception as exc:
                self._log.error("completer: %d outcomes could not be written at stop: %s", left, exc)
        for _, _, fn, abandon in again:  # one more try each, then the reaper's
            if not self._tried(fn, log=False):
                abandon()
        return self.pending
