"""Lease guards (SPEC P1'): a claim whose row was locked elsewhere at a renewal cannot be reaped
while the engine that holds it is alive.

A renewal skips a row another transaction holds locked (an operator in psql): its lease is not
extended that time. A lock held at every renewal and released in between would let the lease
expire, and the reaper take the row while its handler still runs. So the renewal statement
(sql/lease_renew.sql) guards each claim it reports locked with a session-level advisory lock
of the heartbeat's own connection, keyed by the claim token, and the reaper never returns a
claim whose guard it cannot take (sql/lease_reap.sql). The guard is released once a renewal
extended the lease again or the claim is no longer ours; it goes with the session when the
engine dies, so a crashed engine's rows are reaped as before.

A session lock must stay on the session that took it: behind a transaction-pooling proxy
(PgBouncer in transaction mode) consecutive statements run on shared server connections, where
a guard would be left behind. The statement takes one only when the server backend it runs on
is the one the connection was opened to (the process id of the connection's BackendKeyData,
which a pooler makes up); otherwise it says so, logged once. A pooler in session mode, which
would keep the session, cannot be told apart and takes no guard either.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from datetime import timedelta
from typing import Any

import psycopg

from brooq_py.postgres.arrays import uuid_array
from brooq_py.postgres.queries import Queries
from brooq_py.postgres.runner import Rows, Runner, on_connection

log = logging.getLogger("brooq_py.postgres")

# What lease_renew.sql's third column says of a claim it reports locked.
_GUARDED = frozenset({"kept", "taken"})


class LeaseGuards:
    """The guards one session (the Store's heartbeat connection) holds, by claim token.

    Used only inside that connection's ``use`` (one caller at a time). A guard is released
    when a renewal that carried its claim reports it renewed, canceled or gone, or when no
    renewal carried it for a whole lease (its attempt ended; another engine on the same Store
    sends its own claims at least every lease/3), renewals of no lease at all included: an
    engine left with nothing to renew still lets go of the claims it stopped renewing (a
    handler called hung, its row for the reaper, C5).
    """

    def __init__(self) -> None:
        self._session: psycopg.Connection[Any] | None = None
        self._held: dict[str, float] = {}  # claim token -> when a renewal last carried it (monotonic)
        self._told_pooled = False
        self._told_full = False

    @property
    def held(self) -> frozenset[str]:
        """The claim tokens guarded now (as far as this session knows)."""
        return frozenset(self._held)

    def renew(
        self,
        conn: psycopg.Connection[Any],
        queries: Queries,
        params: dict[str, Any],
        tokens: Collection[str],
        lease: timedelta,
    ) -> Rows:
        """Run the renewal on *conn* with the guards it holds, then release those no longer needed."""
        if conn is not self._session:
            self._session, self._held = conn, {}  # a new session: the old one's guards went with it
        run = on_connection(conn)
        rows = run(queries.renew, {**params, "guarded": uuid_array(self._held), "pid": conn.info.backend_pid})
        now = time.monotonic()
        guarded = {str(r[0]) for r in rows if r[2] in _GUARDED}
        if not self._told_full and any(r[2] == "full" for r in rows):
            self._told_full = True
            log.warning(
                "more running jobs were found locked elsewhere at a renewal than the heartbeat's session "
                "may guard (max_locks_per_transaction, its share of the server's lock table): the others "
                "are kept from the reaper by its hold alone (SPEC P1')"
            )
        if not self._told_pooled and any(r[2] == "pooled" for r in rows):
            self._told_pooled = True
            log.error(
                "the heartbeat connection goes through a connection pooler (its statements do not run "
                "on the server process it connected to): a running job's row locked elsewhere at a "
                "renewal cannot be guarded from the reaper (SPEC P1'); give the Store a direct "
                "conninfo (docs/operating.md, PgBouncer)"
            )
        stale = now - lease.total_seconds()
        release = [t for t, at in self._held.items() if t not in guarded and (t in tokens or at < stale)]
        for t in guarded:
            self._held[t] = now
        if release:
            self._release(run, queries, release)
        return rows

    def release(self, conn: psycopg.Connection[Any], queries: Queries, tokens: Collection[str]) -> None:
        """Release the guards of *tokens* this session holds (their engine let those claims go)."""
        mine = [t for t in tokens if t in self._held]
        if conn is self._session and mine:
            self._release(on_connection(conn), queries, mine)

    def release_stale(self, conn: psycopg.Connection[Any], queries: Queries, lease: timedelta) -> None:
        """With no lease to renew: release the guards no renewal carried for a whole lease (their
        attempts ended, or were called hung with their row still processing: the reaper's now)."""
        if conn is not self._session:
            self._session, self._held = conn, {}
            return
        stale = time.monotonic() - lease.total_seconds()
        release = [t for t, at in self._held.items() if at < stale]
        if release:
            self._release(on_connection(conn), queries, release)

    def _release(self, run: Runner, queries: Queries, tokens: list[str]) -> None:
        """Unlock *tokens*' guards (the renewal that extended their leases has committed)."""
        try:
            run(queries["lease_unguard"], {"tokens": uuid_array(tokens)})
        except psycopg.Error:
            return  # kept, released at the next renewal; a broken session took them with it
        for t in tokens:
            self._held.pop(t, None)
