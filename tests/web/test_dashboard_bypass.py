"""Ways around the dashboard's token, CSRF check and escaping that the obvious tests do not try (SPEC O2).

Each request goes over real HTTP to a real uvicorn, the way a browser or an
attacker's script would send it.
"""

from __future__ import annotations

import re
from urllib.parse import quote

from brooq_py.postgres import Store
from brooq_py.queue import Job, State
from tests.web.conftest import TOKEN, Board

TOPIC = "web.bypass"


def test_o2_no_method_or_path_spelling_reaches_a_page_or_action_without_the_token(
    board: Board, store: Store
) -> None:
    job = store.enqueue(Job(TOPIC, {"n": 1})).id
    for method, path in (
        ("HEAD", "/"),
        ("HEAD", f"/jobs/{job}"),
        ("OPTIONS", "/"),
        ("OPTIONS", "/action/cancel"),
        ("GET", "/action/cancel"),
        ("HEAD", "/action/cancel"),
        ("GET", "//"),
        ("GET", "/./"),
        ("GET", "/static/../"),
        ("GET", "/static/..%2f"),
        ("GET", "/static/%2e%2e/"),
        ("GET", "/topics.rows"),
        ("GET", f"/jobs?topic={TOPIC}&state=pending"),
        ("GET", "/dead"),
        ("POST", "/action/cancel"),
        ("POST", "/action/pause"),
        ("POST", "/logout"),
    ):
        form = {"id": job, "topic": TOPIC} if method == "POST" else None
        reply = board.request(method, path, form=form)
        assert reply.status in (303, 401, 403, 404, 405), (method, path, reply.status)
        if reply.status == 303:
            assert "/login" in reply.location, (method, path, reply.location)
        assert job not in reply.body, (method, path)
    assert store.get(job).state == State.PENDING  # type: ignore[union-attr]
    assert store.paused() == set()


def test_o2_a_forged_or_foreign_cookie_is_no_session(board: Board, store: Store) -> None:
    job = store.enqueue(Job(TOPIC, {"n": 1})).id
    for cookie in (
        "brooq_session=",
        "brooq_session=99999999999.",
        "brooq_session=1.deadbeef",
        f"brooq_session={'9' * 30}.{'0' * 64}",
        "brooq_session=-1.abc",
    ):
        assert board.request("GET", "/", cookie=cookie).status == 303, cookie
        reply = board.request("POST", "/action/cancel", form={"id": job, "csrf": "0" * 64}, cookie=cookie)
        assert reply.status in (401, 403), cookie
    # A real session's CSRF token is not valid for another session.
    mine, other = board.login(), board.login()
    page = board.request("GET", "/", cookie=mine).body
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert csrf is not None
    if mine != other:
        reply = board.request("POST", "/action/cancel", form={"id": job, "csrf": csrf[1]}, cookie=other)
        assert reply.status == 403
    assert store.get(job).state == State.PENDING  # type: ignore[union-attr]


def test_o2_login_never_redirects_off_the_dashboard(board: Board) -> None:
    for target in (
        "//evil.example/",
        "https://evil.example/",
        "/\\evil.example",
        "\\\\evil.example",
        "/\t/evil.example",
        " //evil.example",
        "javascript:alert(1)",
        "/%2F/evil.example",
        "%2F%2Fevil.example",
    ):
        reply = board.request("POST", "/login", form={"token": TOKEN, "next": target})
        assert reply.status == 303, target
        location = reply.location
        assert location.startswith("/") and not location.startswith("//"), (target, location)
        assert "\\" not in location and "\t" not in location and location[1:2] not in ("/", "\\"), location


def test_o2_markup_in_a_topic_name_or_a_flash_message_is_text(board: Board, store: Store) -> None:
    evil = '"><script>alert(1)</script><img src=x onerror=alert(2)>'
    store.enqueue(Job(evil, {"n": 1}))
    cookie = board.login()
    for page in ("/", "/topics.rows", f"/jobs?topic={quote(evil)}&state=pending", "/?done=" + quote(evil)):
        body = board.request("GET", page, cookie=cookie).body
        assert "<script>alert(1)" not in body and "<img src=x" not in body, page
        assert '"><script' not in body, page


def test_z2_a_huge_payload_makes_a_bounded_job_page(board: Board, store: Store) -> None:
    """A 30 MB payload is shown in part, with how much was left out, not as a 30 MB page."""
    job = store.enqueue(Job(TOPIC, {"blob": ["x" * 1000] * 30_000})).id
    reply = board.request("GET", f"/jobs/{job}", token=TOKEN)
    assert reply.status == 200
    assert len(reply.body) < 1_000_000
    assert "more characters not shown" in reply.body
