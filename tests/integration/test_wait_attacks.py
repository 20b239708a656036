"""wait()/result() return the outcome exactly as recorded."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Job, JobNotFound, State
from tests.polling import wait_for


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(1e16, marks=pytest.mark.xfail(strict=True, reason="known: docs/results.md, jsonb")),
        pytest.param(1.5e300, marks=pytest.mark.xfail(strict=True, reason="known: docs/results.md, jsonb")),
        2.5e-300,
        -0.0,
        2**80,
        0.1 + 0.2,
        "\u2028x\U0001f600",
        {"b": 1, "a": [None, True]},
    ],
    ids=["1e16", "1.5e300", "2.5e-300", "neg-zero", "2**80", "0.1+0.2", "unicode", "nested"],
)
def test_result_round_trip(store: Store, engines: Callable[..., Engine], value: Any) -> None:
    e = engines(workers=1)
    e.register_kind("ret", lambda ctx, claim: value)
    jid = store.enqueue(Job("ret", 1)).id
    e.start()
    got = store.result(jid, timeout=30)
    assert type(got) is type(value) and got == value, (
        f"returned {value!r} ({type(value).__name__}), result() gave {got!r} ({type(got).__name__})"
    )


def test_wait_on_a_job_retention_deletes_while_waiting(
    store: Store, engines: Callable[..., Engine], dsn: str
) -> None:
    """A waiter blocked on a job that ends and is then deleted by retention before the waiter looks:
    JobNotFound (documented), never a hang."""
    import threading

    gate = threading.Event()
    e = engines(workers=1, retention_ttl=timedelta(milliseconds=1), retention_period=0.2)
    e.register_kind("gone", lambda ctx, claim: gate.wait(30) and {"ok": True})
    jid = store.enqueue(Job("gone", 1)).id
    e.start()
    out: dict[str, Any] = {}

    def waiter() -> None:
        try:
            out["row"] = store.wait(jid, timeout=60)
        except BaseException as exc:
            out["error"] = exc

    t = threading.Thread(target=waiter)
    t.start()
    wait_for(lambda: (r := store.get(jid)) is not None and r.state is State.PROCESSING, "running", timeout=30)
    gate.set()
    t.join(60)
    assert not t.is_alive()
    assert ("row" in out and out["row"].state is State.DONE) or isinstance(out.get("error"), JobNotFound), out
