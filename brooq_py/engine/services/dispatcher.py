"""Dispatcher: claims up to the free slots in one statement and hands the claims out (SPEC C1, F1)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from brooq_py.engine.attempt.runner import SlotPool
from brooq_py.engine.services.ticker import worth_logging
from brooq_py.queue.port import ClaimedJob


class Dispatcher:
    """One thread: wait for a free slot and a wake-up (or the poll interval), claim at most *batch*
    rows and launch them; the next claim follows at once while claims come back full. *next_due*:
    seconds until a claim is due sooner than the poll; when the wait for it ends with no wake-up,
    *owed* names the topics whose owed read it was, and *claim_only* claims those alone."""

    def __init__(
        self,
        claim: Callable[[int], list[ClaimedJob]],
        slots: SlotPool,
        launch: Callable[[list[ClaimedJob]], None],
        poll_interval: float,
        log: logging.Logger,
        hand_back: Callable[[list[ClaimedJob]], None] | None = None,
        batch: int | None = None,
        next_due: Callable[[], float | None] | None = None,
        owed: Callable[[], list[str]] | None = None,
        claim_only: Callable[[int, list[str]], list[ClaimedJob]] | None = None,
    ) -> None:
        self._claim = claim
        self._slots = slots
        self._launch = launch
        self._poll = poll_interval
        self._log = log
        self._hand_back = hand_back
        self._batch = batch
        self._next_due = next_due or (lambda: None)
        self._owed = owed if claim_only is not None else None
        self._claim_only = claim_only
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="brooq-dispatcher", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        thread, self._thread = self._thread, None
        self._stop.set()
        self._wake.set()
        if thread is not None:
            thread.join(timeout)

    def _loop(self) -> None:
        backlog = True  # look once at start-up without waiting
        failures = 0
        while not self._stop.is_set():
            if self._slots.wait_free(0.25) == 0:
                continue
            only: list[str] = []
            if not backlog:
                due = self._next_due()
                woken = self._wake.wait(self._poll if due is None else min(self._poll, due))
                if woken:  # one that comes after a timeout, even before this line, is kept
                    self._wake.clear()
                if not woken and due is not None and due < self._poll:  # the due time came
                    only = self._owed() if self._owed is not None else []
                    again = None if only else self._next_due()
                    if not only and (again is None or again > 0):
                        continue  # what fell due was made elsewhere (an engine sharing the Store)
            else:
                self._wake.clear()
            if self._stop.is_set():
                return
            free = self._slots.free
            if self._batch is not None:
                free = min(free, self._batch)
            if free <= 0:
                backlog = True
                continue
            try:
                rows = self._claim_only(free, only) if only and self._claim_only else self._claim(free)
            except Exception as exc:
                failures += 1
                delay = min(self._poll, 0.1 * 2 ** min(failures, 8))
                if worth_logging(failures):
                    self._log.warning("dispatcher: claim failed (%s); retrying in %.2fs", exc, delay)
                backlog = False
                time.sleep(delay)
                continue
            if failures:
                self._log.info("dispatcher: claiming works again after %d failures", failures)
            failures = 0
            backlog = len(rows) >= free
            if self._stop.is_set() and rows and self._hand_back is not None:
                # stop() gave up waiting for this claim: the slots may be stopping, the rows go back
                self._hand_back(rows)
                return
            if rows:
                self._launch(rows)
