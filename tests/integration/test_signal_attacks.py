"""signals sent in callers' transactions (SPEC DS4)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Job, State
from tests.integration.conftest import wait_listening
from tests.integration.test_durable_signals import approval, waiting
from tests.integration.test_durable_steps import OPTS
from tests.polling import wait_for


def _blocked(dsn: str, pid: int) -> bool:
    with psycopg.connect(dsn, autocommit=True) as c:
        return bool(
            c.execute(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchone()[0]
        )


@pytest.mark.parametrize("level", ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"])
@pytest.mark.parametrize("commit_first", [True, False])
def test_two_signals_of_one_name_in_two_open_transactions(
    store: Store, dsn: str, level: str, commit_first: bool
) -> None:
    jid = store.enqueue(Job("t", 1)).id
    out: dict[str, Any] = {}
    with psycopg.connect(dsn) as t1, psycopg.connect(dsn) as t2:
        t2.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        t2.execute("SELECT 1")  # T2's snapshot: before T1's signal commits
        assert store.signal(jid, "go", "first", tx=t1) is True

        def run() -> None:
            try:
                out["second"] = store.signal(jid, "go", "second", tx=t2)
                out["status"] = t2.info.transaction_status
                t2.execute("SELECT 1")  # still usable
                t2.commit()
            except BaseException as exc:
                out["error"] = exc

        th = threading.Thread(target=run)
        th.start()
        wait_for(
            lambda: _blocked(dsn, t2.info.backend_pid) or not th.is_alive(), "T2 waits on T1", timeout=30
        )
        t1.commit() if commit_first else t1.rollback()
        th.join(60)
    assert "error" not in out, out.get("error")
    assert out["status"] == TransactionStatus.INTRANS
    with psycopg.connect(dsn) as c:
        payloads = [
            r[0]
            for r in c.execute(f'SELECT payload FROM "{store.schema}".job_signal WHERE job_id = %s', (jid,))
        ]
    if commit_first:
        assert out["second"] is False and payloads == ["first"]
    else:
        # T1 never happened: T2's is the first of the name
        assert out["second"] is True and payloads == ["second"]


def test_signal_to_a_finished_job_is_false_and_harmless(
    store: Store, dsn: str, engines: Callable[..., Engine]
) -> None:
    e = engines()
    e.register_kind("fin", lambda ctx, claim: {"ok": 1})
    jid = store.enqueue(Job("fin", 1)).id
    e.start()
    assert store.wait(jid, timeout=30).state is State.DONE
    with psycopg.connect(dsn) as conn:
        assert store.signal(jid, "go", 1, tx=conn) is False
        assert conn.info.transaction_status == TransactionStatus.INTRANS
        conn.commit()
    assert store.signal(jid, "go", 1) is False
    assert store.result(jid, timeout=5) == {"ok": 1}


def test_a_waiting_job_wakes_only_after_the_commit_and_soon_after_it(
    store: Store, dsn: str, engines: Callable[..., Engine]
) -> None:
    e = engines(workers=1)
    e.register_kind("approve", approval, OPTS)
    jid = e.enqueue(Job("approve", {})).id
    e.start()
    wait_listening(store.session.pool, store.schema)  # type: ignore[arg-type]
    waiting(store, jid, "approval")
    with psycopg.connect(dsn) as conn:
        # a rolled-back savepoint's signal first: never happened
        with pytest.raises(RuntimeError), conn.transaction():
            assert store.signal(jid, "approval", "undone", tx=conn) is True
            raise RuntimeError
        assert store.signal(jid, "approval", "kept", tx=conn) is True
        deadline = time.monotonic() + 3  # held open: the job must still wait
        while time.monotonic() < deadline:
            row = store.get(jid)
            assert row is not None and row.state is State.SCHEDULED and row.waiting_for == "approval"
            time.sleep(0.1)
        conn.commit()
        committed = time.monotonic()
    row = store.wait(jid, timeout=30)
    woke = time.monotonic() - committed
    assert row.result == {"decision": "kept"}
    assert woke < 2.5, f"woke {woke:.2f}s after the signal's commit"


def test_signal_then_caller_rolls_back_while_the_job_runs(
    store: Store, dsn: str, engines: Callable[..., Engine]
) -> None:
    """A signal sent while the job runs (before its wait_for), in a transaction rolled back later: the
    handler must not see it."""
    started = threading.Event()
    go_on = threading.Event()

    def handler(ctx: Any, claim: Any) -> Any:
        started.set()
        go_on.wait(30)
        return {"got": ctx.wait_for("approval", 3)}

    from brooq_py.queue import SignalTimeout

    def wrapped(ctx: Any, claim: Any) -> Any:
        try:
            return handler(ctx, claim)
        except SignalTimeout:
            return {"timed_out": True}

    e = engines(workers=1)
    e.register_kind("approve2", wrapped, OPTS)
    jid = e.enqueue(Job("approve2", {})).id
    e.start()
    assert started.wait(30)
    with psycopg.connect(dsn) as conn:
        assert store.signal(jid, "approval", "rolled back", tx=conn) is True
        go_on.set()
        time.sleep(0.5)  # the handler's wait_for runs while the signal is uncommitted (not pass/fail)
        conn.rollback()
    row = store.wait(jid, timeout=60)
    assert row.result == {"timed_out": True}
