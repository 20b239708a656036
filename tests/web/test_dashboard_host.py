"""A dashboard without a token trusts loopback only: a page fetched under a foreign host name is refused.

DNS rebinding: a web page on attacker.example makes its name resolve to
127.0.0.1, so the victim's browser sends the attacker's requests to the local
dashboard under the attacker's origin. Same-origin and SameSite cookies then
protect nothing (the attacker's script reads the page, its fresh session cookie
and its CSRF token); only the Host header tells such a request apart.
"""

from __future__ import annotations

import http.client
import re
from collections.abc import Callable
from urllib.parse import urlencode

from brooq_py.postgres import Store
from brooq_py.queue import Job
from tests.web.conftest import TOKEN, Board

TOPIC = "host.check"


def _get(board: Board, path: str, host: str, **headers: str) -> tuple[int, str, list[str]]:
    conn = http.client.HTTPConnection("127.0.0.1", board.port, timeout=30)
    try:
        conn.request("GET", path, headers={"Host": host, **headers})
        resp = conn.getresponse()
        cookies = [v for k, v in resp.getheaders() if k.lower() == "set-cookie"]
        return resp.status, resp.read().decode(), cookies
    finally:
        conn.close()


def _post(board: Board, path: str, host: str, form: dict[str, str], cookie: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", board.port, timeout=30)
    try:
        headers = {"Host": host, "Cookie": cookie, "Content-Type": "application/x-www-form-urlencoded"}
        conn.request("POST", path, body=urlencode(form), headers=headers)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def test_o2_a_tokenless_dashboard_refuses_a_rebound_host_name(
    store: Store, serve_board: Callable[..., Board]
) -> None:
    board = serve_board()
    store.enqueue(Job(TOPIC, None))
    status, body, cookies = _get(board, "/", f"attacker.example:{board.port}")
    assert status == 403, body
    assert not cookies  # no session, hence no CSRF token, for a foreign origin
    csrf = re.search(r'name="csrf" value="([^"]*)"', body)
    if cookies and csrf:  # were it served, the rebinding page could act
        session = cookies[0].split(";", 1)[0]
        _post(
            board,
            "/action/pause",
            f"attacker.example:{board.port}",
            {"topic": TOPIC, "csrf": csrf[1]},
            session,
        )
    assert store.paused() == set()
    # The dashboard's own names still work.
    for host in (f"127.0.0.1:{board.port}", f"localhost:{board.port}", "localhost", f"[::1]:{board.port}"):
        status, body, _ = _get(board, "/", host)
        assert status == 200, (host, body)


def test_o2_with_a_token_any_host_name_may_log_in(serve_board: Callable[..., Board]) -> None:
    """Behind a proxy the dashboard is reached under a real name: the token, not the host, guards it."""
    board = serve_board(token=TOKEN)
    status, _, _ = _get(board, "/", "queue.example.com", Authorization=f"Bearer {TOKEN}")
    assert status == 200
