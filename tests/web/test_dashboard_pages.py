"""The job page and the topics table as a newcomer reads them: /jobs/<id> (the API's address too),
the way back after an action, what a finished or canceled job shows, "-" for no ready job, and a
dashboard of an AsyncStore."""

from __future__ import annotations

import re
from typing import Any

from psycopg_pool import AsyncConnectionPool

from brooq_py.http.server import ThreadedUvicorn
from brooq_py.postgres import AsyncStore, Store
from brooq_py.queue import Job, State
from brooq_py.web import dashboard
from tests.web.conftest import TOKEN, Board
from tests.web.test_dashboard_http import csrf_of, kill


def facts(html: str) -> dict[str, str]:
    return dict(re.findall(r"<dt>([^<]+)</dt><dd[^>]*>(.*?)</dd>", html, re.S))


def test_the_job_page_is_at_jobs_id_and_the_old_address_redirects(board: Board, store: Store) -> None:
    job_id = store.enqueue(Job("web.page", {"a": 1})).id
    page = board.request("GET", f"/jobs/{job_id}", token=TOKEN)
    assert page.status == 200 and job_id in page.body
    old = board.request("GET", f"/job/{job_id}?x=1", token=TOKEN)
    assert old.status == 308 and old.location == f"/jobs/{job_id}?x=1"


def test_retry_on_a_job_page_comes_back_to_that_job(board: Board, store: Store, pool: Any) -> None:
    job_id = store.enqueue(Job("web.page", {"a": 1})).id
    kill(pool, store.schema, [job_id])
    session = board.login()
    page = board.request("GET", f"/jobs/{job_id}", cookie=session)
    (back,) = set(re.findall(r'name="back" value="([^"]*)"', page.body))
    assert back == f"/jobs/{job_id}"
    done = board.request(
        "POST", "/action/retry", form={"id": job_id, "csrf": csrf_of(page.body), "back": back}, cookie=session
    )
    assert done.status == 303 and done.location.startswith(f"/jobs/{job_id}?done="), done.location
    assert store.get(job_id).state == State.PENDING  # type: ignore[union-attr]


def test_a_finished_job_shows_no_lock_and_an_active_one_does(board: Board, store: Store, pool: Any) -> None:
    pending = store.enqueue(Job("web.page", None)).id
    dead = store.enqueue(Job("web.page", None)).id
    kill(pool, store.schema, [dead])
    assert "Locked by" in facts(board.request("GET", f"/jobs/{pending}", token=TOKEN).body)
    shown = facts(board.request("GET", f"/jobs/{dead}", token=TOKEN).body)
    assert "Locked by" not in shown and "Lease ends" not in shown
    assert shown["State"] == "dead"


def test_a_canceled_job_says_it_was_canceled(board: Board, store: Store) -> None:
    job_id = store.enqueue(Job("web.page", None)).id
    assert store.cancel(job_id)
    body = board.request("GET", f"/jobs/{job_id}", token=TOKEN).body
    assert 'id="canceled"' in body and "Canceled by a cancel" in body
    assert "Last error" not in body and "None." not in body


def test_oldest_ready_is_a_dash_when_nothing_is_ready(board: Board, store: Store) -> None:
    store.cancel(store.enqueue(Job("web.none-ready", None)).id)
    body = board.request("GET", "/", token=TOKEN).body
    row = re.search(r'<tr data-topic="web.none-ready">(.*?)</tr>', body, re.S)
    assert row is not None
    cell = re.search(r'data-label="oldest ready">([^<]*)<', row.group(1))
    assert cell is not None and cell.group(1) == "-"


def test_a_dashboard_of_an_async_store(store: Store, dsn: str) -> None:
    store.enqueue(Job("web.async", None))
    astore = AsyncStore(AsyncConnectionPool(dsn, open=False), schema=store.schema)
    server = ThreadedUvicorn(dashboard(astore, token=TOKEN), "127.0.0.1", 0)
    try:
        port = server.address[1]
        body = Board(f"http://127.0.0.1:{port}", port).request("GET", "/", token=TOKEN).body
        assert 'data-topic="web.async"' in body
    finally:
        server.close()
