"""The dashboard over real HTTP on a real uvicorn: the token, the cookie, CSRF, read-only, escaping, paging."""

from __future__ import annotations

import asyncio
import re
import urllib.parse
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from brooq_py.engine import Config, Engine
from brooq_py.postgres import Store
from brooq_py.queue import Job, State
from brooq_py.web import dashboard
from tests.web.conftest import TOKEN, Board

TOPIC = "web.http"


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert match is not None, "no CSRF field on the page"
    return match.group(1)


def test_o2_every_page_needs_the_token(board: Board, store: Store) -> None:
    """O2: without the token every page redirects to the login form and every action is 401."""
    job_id = store.enqueue(Job(TOPIC, {"a": 1})).id
    pages = ["/", "/topics.rows", f"/jobs?topic={TOPIC}&state=pending", f"/jobs/{job_id}", "/dead"]
    for page in pages:
        for token in (None, TOKEN + "x", ""):
            reply = board.request("GET", page, token=token)
            assert reply.status == 303, page
            assert reply.location.startswith("/login?next=%2F"), reply.location
            assert TOPIC not in reply.body
        assert board.request("GET", page, token=TOKEN).status == 200, page
        assert board.request("GET", page, cookie="brooq_session=1.abc").status == 303
    for action, field in (("cancel", ("id", job_id)), ("pause", ("topic", TOPIC))):
        assert board.request("POST", f"/action/{action}", form=[field]).status == 401
    assert store.get(job_id).state == State.PENDING  # type: ignore[union-attr]
    assert store.paused() == set()


def test_login_sets_an_httponly_samesite_strict_cookie(board: Board) -> None:
    wrong = board.request("POST", "/login", form={"token": "nope", "next": "/"})
    assert wrong.status == 401 and wrong.cookies == []
    assert "not the right one" in wrong.body
    right = board.request("POST", "/login", form={"token": TOKEN, "next": "/dead"})
    assert right.status == 303 and right.location == "/dead"
    (cookie,) = right.cookies
    flags = {part.strip().lower() for part in cookie.split(";")}
    assert "httponly" in flags and "samesite=strict" in flags and "path=/" in flags
    assert TOKEN not in cookie
    session = cookie.split(";", 1)[0]
    assert board.request("GET", "/", cookie=session).status == 200
    # No open redirect: a foreign target falls back to the dashboard's root.
    away = board.request("POST", "/login", form={"token": TOKEN, "next": "//evil.example/"})
    assert away.location == "/"


def test_actions_need_the_csrf_token_of_the_session(board: Board, store: Store) -> None:
    """A cookie alone never acts: the form must carry the session's CSRF token (a bearer header needs none)."""
    job_id = store.enqueue(Job(TOPIC, {"a": 1})).id
    session = board.login()
    page = board.request("GET", f"/jobs/{job_id}", cookie=session)
    token = csrf_of(page.body)
    for bad in (None, "", "0" * 64, token[:-1] + ("0" if token[-1] != "0" else "1")):
        form = {"id": job_id} if bad is None else {"id": job_id, "csrf": bad}
        assert board.request("POST", "/action/cancel", form=form, cookie=session).status == 403
    assert store.get(job_id).state == State.PENDING  # type: ignore[union-attr]
    other = board.login()
    if other != session:  # another session's token is not this one's
        assert (
            board.request(
                "POST",
                "/action/cancel",
                form={"id": job_id, "csrf": csrf_of(board.request("GET", "/", cookie=other).body)},
                cookie=session,
            ).status
            == 403
        )
    ok = board.request(
        "POST", "/action/cancel", form={"id": job_id, "csrf": token, "back": "/"}, cookie=session
    )
    assert ok.status == 303 and "done=" in ok.location
    assert store.get(job_id).state == State.CANCELED  # type: ignore[union-attr]
    assert board.request("POST", "/action/retry", form={"id": job_id}, token=TOKEN).status == 303
    assert store.get(job_id).state == State.PENDING  # type: ignore[union-attr]


def test_read_only_hides_and_refuses_every_action(serve_board: Callable[..., Board], store: Store) -> None:
    board = serve_board(token=TOKEN, read_only=True)
    job_id = store.enqueue(Job(TOPIC, {"a": 1})).id
    for page in ("/", f"/jobs/{job_id}", f"/jobs?topic={TOPIC}&state=pending", "/dead"):
        body = board.request("GET", page, token=TOKEN).body
        assert "/action/" not in body and "data-action" not in body, page
        assert "read-only" in body
    for action, form in (
        ("cancel", {"id": job_id}),
        ("pause", {"topic": TOPIC}),
        ("retry-many", {"id": job_id}),
    ):
        assert board.request("POST", f"/action/{action}", form=form, token=TOKEN).status == 403
    assert store.get(job_id).state == State.PENDING  # type: ignore[union-attr]
    assert store.paused() == set()


def test_the_login_page_shows_no_read_only_badge(serve_board: Callable[..., Board]) -> None:
    """Nobody is signed in on the login page: it says nothing of what a token may do."""
    for read_only in (False, True):
        board = serve_board(token=TOKEN, read_only=read_only)
        login = board.request("GET", "/login")
        assert login.status == 200 and 'id="read-only"' not in login.body
        refused = board.request("GET", "/login?next=/")
        assert 'id="read-only"' not in refused.body
        signed_in = board.request("GET", "/", token=TOKEN).body
        assert ('id="read-only"' in signed_in) is read_only


def test_the_result_card_says_honestly_why_there_is_no_result(board: Board, store: Store, pool: Any) -> None:
    """Issue: a dead job said "Not done yet"; each state now says what its missing result means."""
    from datetime import UTC, datetime, timedelta

    dead = store.enqueue(Job(TOPIC, {"n": 1})).id
    kill(pool, store.schema, [dead])
    canceled = store.enqueue(Job(TOPIC, {"n": 2})).id
    store.cancel(canceled)
    pending = store.enqueue(Job(TOPIC, {"n": 3})).id
    scheduled = store.enqueue(Job(TOPIC, {"n": 4}, available_at=datetime.now(UTC) + timedelta(hours=1))).id
    blocked = store.enqueue(Job(TOPIC, {"n": 5}, after=[pending])).id
    waiting = store.enqueue(Job("approvals", {"n": 6})).id
    engine = Engine(store, Config(workers=1))
    engine.register_kind("approvals", lambda ctx, claim: ctx.wait_for("approve", 3600))
    try:
        engine.run_once()  # the handler waits: the job is scheduled until the signal or the timeout
    finally:
        engine.close()
    expected = {
        waiting: "Waiting for the signal &#39;approve&#39;: no result yet",
        dead: "Ended dead: no result.",
        canceled: "Canceled: no result.",
        pending: "Pending: no result yet",
        scheduled: "Scheduled: no result yet",
        blocked: "Blocked: no result yet",
    }
    for job_id, label in expected.items():
        body = board.request("GET", f"/jobs/{job_id}", token=TOKEN).body
        assert label in body, (job_id, label)
        assert "Not done yet" not in body


def test_payload_and_errors_are_escaped(board: Board, store: Store) -> None:
    evil = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    job_id = store.enqueue(Job("<b>topic</b>", {"html": evil})).id
    body = board.request("GET", f"/jobs/{job_id}", token=TOKEN).body
    assert "<script>alert" not in body and "<img src=x" not in body and "<b>topic" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert "&lt;b&gt;topic&lt;/b&gt;" in body
    headers = board.request("GET", "/", token=TOKEN).headers
    assert "script-src 'self'" in headers["content-security-policy"]
    assert headers["x-frame-options"] == "DENY"


def test_without_a_token_only_loopback_is_served(store: Store, serve_board: Callable[..., Board]) -> None:
    """No token: answered on a loopback address (with CSRF still required), refused elsewhere."""
    board = serve_board()
    store.enqueue(Job(TOPIC, None))
    first = board.request("GET", "/")
    assert first.status == 200 and first.cookies  # a session for the CSRF token, no login
    session = first.cookies[0].split(";", 1)[0]
    assert board.request("POST", "/action/pause", form={"topic": TOPIC}, cookie=session).status == 403
    ok = board.request(
        "POST", "/action/pause", form={"topic": TOPIC, "csrf": csrf_of(first.body)}, cookie=session
    )
    assert ok.status == 303 and store.paused() == {TOPIC}

    app = dashboard(store)
    sent: list[dict[str, Any]] = []

    async def call(server: tuple[str, int]) -> int:
        sent.clear()
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": "/",
            "raw_path": b"/",
            "root_path": "",
            "query_string": b"",
            "headers": [],
            "server": server,
            "client": ("203.0.113.9", 5000),
        }

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app(scope, receive, send)
        return int(sent[0]["status"])

    assert asyncio.run(call(("10.1.2.3", 8080))) == 403
    assert b"no token" in b"".join(m.get("body", b"") for m in sent)
    assert asyncio.run(call(("::1", 8080))) == 200


def test_jobs_pages_are_keyset_paged_newest_first(board: Board, store: Store) -> None:
    ids = [store.enqueue(Job(TOPIC, {"n": n})).id for n in range(120)]
    seen: list[str] = []
    path: str | None = f"/jobs?topic={TOPIC}&state=pending"
    pages = 0
    while path is not None:
        body = board.request("GET", path, token=TOKEN).body
        seen += re.findall(r'data-job="([0-9a-f-]{36})"', body)
        nxt = re.search(r'id="next" href="([^"]+)"', body)
        path = nxt.group(1).replace("&amp;", "&") if nxt else None
        pages += 1
    assert pages == 3 and len(seen) == 120 and set(seen) == set(ids)
    assert seen[0] == ids[-1]  # the newest first
    bad = board.request("GET", f"/jobs?topic={TOPIC}&state=pending&after=1|x|y", token=TOKEN)
    assert bad.status == 400
    assert board.request("GET", f"/jobs?topic={TOPIC}&state=nonsense", token=TOKEN).status == 400


@pytest.mark.parametrize("state", ["pending", "done"])
def test_o2_a_topic_no_job_can_have_is_a_400_not_a_500(board: Board, state: str) -> None:
    """A NUL (which PostgreSQL text cannot hold) or an overlong topic is refused before any query."""
    for topic in ("\x00", "a\x00b", "x" * 256):
        reply = board.request("GET", f"/jobs?topic={urllib.parse.quote(topic)}&state={state}", token=TOKEN)
        assert reply.status == 400, (topic[:10], reply.status)
    assert board.request("GET", f"/jobs?topic={'x' * 255}&state={state}", token=TOKEN).status == 200


def test_q1_retry_all_shown_dead_jobs(board: Board, store: Store, pool: Any) -> None:
    ids = [store.enqueue(Job(TOPIC, {"n": n})).id for n in range(3)]
    kill(pool, store.schema, ids)
    body = board.request("GET", "/dead", token=TOKEN).body
    shown = re.findall(r'data-job="([0-9a-f-]{36})"', body)
    assert sorted(shown) == sorted(ids)
    reply = board.request("POST", "/action/retry-many", form=[("id", i) for i in shown], token=TOKEN)
    assert reply.status == 303
    assert all(store.get(i).state == State.PENDING for i in ids)  # type: ignore[union-attr]
    assert board.request("POST", "/action/retry-many", form=[("id", "x")] * 51, token=TOKEN).status == 400
    assert board.request("POST", "/action/retry", form={"id": str(uuid.uuid4())}, token=TOKEN).status == 404
    assert board.request("POST", "/action/retry", form={"id": "nope"}, token=TOKEN).status == 400


def test_u3_retry_all_says_why_a_job_was_not_retried(board: Board, store: Store, pool: Any) -> None:
    """A dead job whose unique key an active job now holds is not retried by the bulk action (U3),
    and the message says which and why; the others are retried."""
    keyed = store.enqueue(Job(TOPIC, {"n": 0}, unique_key="k")).id
    plain = store.enqueue(Job(TOPIC, {"n": 1})).id
    kill(pool, store.schema, [keyed, plain])
    holder = store.enqueue(Job(TOPIC, {"n": 2}, unique_key="k"))
    assert holder.created
    reply = board.request("POST", "/action/retry-many", form=[("id", keyed), ("id", plain)], token=TOKEN)
    assert reply.status == 303
    message = urllib.parse.parse_qs(urllib.parse.urlsplit(reply.location).query)["done"][0]
    assert message.startswith("1 of 2 jobs retried; not retried: " + keyed[:8]), message
    assert holder.id in message and "unique key 'k'" in message, message
    assert store.get(plain).state == State.PENDING  # type: ignore[union-attr]
    assert store.get(keyed).state == State.DEAD  # type: ignore[union-attr]


def test_u3_retry_all_says_why_for_every_job_not_retried(board: Board, store: Store, pool: Any) -> None:
    """Issue: the bulk retry named the first three refusals only; it now says why for each one."""
    keyed = [store.enqueue(Job(TOPIC, {"n": n}, unique_key=f"k{n}")).id for n in range(4)]
    plain = store.enqueue(Job(TOPIC, {"n": 9})).id
    kill(pool, store.schema, [*keyed, plain])
    holders = [store.enqueue(Job(TOPIC, {"n": n}, unique_key=f"k{n}")).id for n in range(4)]
    pending = store.enqueue(Job(TOPIC, {"n": 10})).id  # shown dead once, retried elsewhere since
    form = [("id", i) for i in [*keyed, plain, pending]]
    reply = board.request("POST", "/action/retry-many", form=form, token=TOKEN)
    message = urllib.parse.parse_qs(urllib.parse.urlsplit(reply.location).query)["done"][0]
    assert message.startswith("1 of 6 jobs retried; not retried: "), message
    for n, (job, holder) in enumerate(zip(keyed, holders, strict=True)):
        assert f"{job}: job {holder} is active with the same unique key 'k{n}'" in message, message
    assert f"{pending}: job {pending} is pending: only dead or canceled" in message, message
    assert "more" not in message


def kill(pool: Any, schema: str, ids: list[str], error: str = "RuntimeError: boom") -> None:
    """Make *ids* dead as the engine would have (test set-up, straight SQL)."""
    from psycopg import sql

    with pool.connection() as conn:
        conn.execute(
            sql.SQL(
                "UPDATE {} SET state = 'dead', attempts = 3, last_error = %s, updated_at = now() WHERE id = ANY(%s)"
            ).format(sql.Identifier(schema, "job")),
            (error, ids),
        )


@pytest.mark.parametrize("mount", ["/brooq"])
def test_mounted_under_a_prefix(store: Store, mount: str) -> None:
    """``app.mount("/brooq", dashboard(...))`` in a user's Starlette app: links and the cookie follow the prefix."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from brooq_py.http.server import ThreadedUvicorn

    outer = Starlette(routes=[Mount(mount, app=dashboard(store, token=TOKEN))])
    server = ThreadedUvicorn(outer, "127.0.0.1", 0)
    try:
        board = Board(f"http://127.0.0.1:{server.address[1]}{mount}", server.address[1], prefix=mount)
        assert board.request("GET", "/").location == f"{mount}/login?next=%2F"
        reply = board.request("POST", "/login", form={"token": TOKEN, "next": "/"})
        assert reply.location == f"{mount}/" and f"Path={mount}" in reply.cookies[0]
        body = board.request("GET", "/", cookie=reply.cookies[0].split(";")[0]).body
        assert f'href="{mount}/static/app.css"' in body
        assert board.request("GET", "/static/app.js").status == 200
        bare = board.request("GET", "")  # the mount's own address, without the slash
        assert bare.status in (307, 308) and bare.location.endswith(f"{mount}/")
    finally:
        server.close()


def test_database_down_is_a_short_503_page(schema: str) -> None:
    """An unreachable database is a 503 page on every read and action, never a 500 or a traceback."""
    from psycopg_pool import ConnectionPool

    from brooq_py.http.server import ThreadedUvicorn

    dead: ConnectionPool[Any] = ConnectionPool(
        "postgresql://root@127.0.0.1:1/test?connect_timeout=1", min_size=1, open=False, timeout=1
    )
    dead.open(wait=False)
    store = Store(dead, schema=schema)
    server = ThreadedUvicorn(dashboard(store, token=TOKEN), "127.0.0.1", 0)
    try:
        board = Board(f"http://127.0.0.1:{server.address[1]}", server.address[1])
        job_id = str(uuid.uuid4())
        for method, path, form in (
            ("GET", "/", None),
            ("GET", "/topics.rows", None),
            ("GET", "/dead", None),
            ("GET", f"/jobs/{job_id}", None),
            ("GET", f"/jobs?topic={TOPIC}&state=pending", None),
            ("POST", "/action/pause", {"topic": TOPIC}),
            ("POST", "/action/cancel", {"id": job_id}),
        ):
            reply = board.request(method, path, form=form, token=TOKEN)
            assert reply.status == 503, (path, reply.status)
            assert "database unavailable" in reply.body and "Traceback" not in reply.body
    finally:
        server.close()
        store.close()
        dead.close()


def test_forms_are_bounded_and_read_after_the_token(board: Board, store: Store) -> None:
    """A form body over 64 KiB is refused (413) unread; without the token nothing is read at all (401)."""
    import http.client

    def post(path: str, length: int, token: str | None) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", board.port, timeout=30)
        try:
            conn.putrequest("POST", path)
            conn.putheader("Content-Type", "application/x-www-form-urlencoded")
            conn.putheader("Content-Length", str(length))
            if token:
                conn.putheader("Authorization", f"Bearer {token}")
            conn.endheaders()  # the body never comes: the answer must not wait for it
            resp = conn.getresponse()
            resp.read()
            return resp.status
        finally:
            conn.close()

    assert post("/action/pause", 10 * 1024 * 1024, None) == 401
    assert post("/action/pause", 10 * 1024 * 1024, TOKEN) == 413
    assert post("/login", 10 * 1024 * 1024, None) == 413
    assert store.paused() == set()


def test_v1_v3_v4_the_job_page_shows_result_failed_attempts_and_progress(board: Board, store: Store) -> None:
    from datetime import timedelta

    from brooq_py.queue.port import EngineProof, HeldLease, Outcome

    lease = timedelta(seconds=30)
    job_id = store.enqueue(Job(TOPIC, {"a": 1})).id
    (c,) = store.worker.claim([TOPIC], 1, "w", lease)
    held = [HeldLease(c.id, c.claim_token, 0.42, "resizing <img>")]
    store.worker.beat(EngineProof("w", "h", 1, lease, lease / 3), held)
    assert store.worker.write_progress(held) == {c.claim_token}  # the heartbeat's, after its beat
    running = board.request("GET", f"/jobs/{job_id}", token=TOKEN).body
    assert "42%" in running and "resizing &lt;img&gt;" in running and "Running: no result yet." in running
    tb = 'Traceback (most recent call last):\n  File "app.py", line 3, in handler\nValueError: <bad>\n'
    store.worker.settle_many(
        [Outcome(c.id, c.claim_token, State.FAILED, last_error="ValueError: <bad>", traceback=tb)]
    )
    assert store.worker.stage([TOPIC], 10, notify=False).total == 1
    (c2,) = store.worker.claim([TOPIC], 1, "w", lease)
    store.worker.settle_many([Outcome(c2.id, c2.claim_token, State.DONE, result='{"answer": "<42>"}')])
    body = board.request("GET", f"/jobs/{job_id}", token=TOKEN).body
    assert 'id="result"' in body and "&#34;answer&#34;: &#34;&lt;42&gt;&#34;" in body.replace(
        "&quot;", "&#34;"
    )
    assert "Failed attempts" in body and "Attempt 1" in body
    assert "in handler" in body and "ValueError: &lt;bad&gt;" in body  # the traceback, escaped


def test_d3_the_job_page_lists_parents_and_children_with_states_and_links(board: Board, store: Store) -> None:
    """A blocked job shows its parents, a parent its children, each linked with its state; cancel is offered."""
    parent = store.enqueue(Job(TOPIC, {"a": 1})).id
    child = store.enqueue(Job("web.child", after=[parent])).id
    page = board.request("GET", f"/jobs/{child}", token=TOKEN)
    assert page.status == 200
    assert 'id="state">blocked<' in page.body
    assert f'href="/jobs/{parent}"' in page.body and "state-pending" in page.body
    assert 'action="/action/cancel"' in page.body  # a blocked job can be canceled
    page = board.request("GET", f"/jobs/{parent}", token=TOKEN)
    assert f'href="/jobs/{child}"' in page.body and "state-blocked" in page.body
    plain = board.request("GET", f"/jobs/{store.enqueue(Job(TOPIC)).id}", token=TOKEN)
    assert 'id="relatives"' not in plain.body
    assert store.cancel(parent)  # the child is canceled with it, and its page says why
    page = board.request("GET", f"/jobs/{child}", token=TOKEN)
    assert "because a job it waited for ended without success" in page.body
    assert f"canceled: parent {parent} ended canceled" in page.body


def test_the_live_refreshs_rows_send_their_actions_back_to_the_topics_page(
    board: Board, store: Store
) -> None:
    """The rows the live refresh swaps in carry forms too: their answer must come back to the topics
    page, not to the fragment (seen in a browser as a bare rows page after a rate set from a menu)."""
    store.enqueue(Job(TOPIC, {"a": 1}))
    for page in ("/", "/topics.rows"):
        body = board.request("GET", page, token=TOKEN).body
        backs = set(re.findall(r'name="back" value="([^"]*)"', body))
        assert backs == {"/"}, (page, backs)
