"""Payload previews in the job lists, and the search by payload containment (issue: dashboard item 4).

The search reads a bounded window of a listing (``SEARCH_SCAN`` jobs, in the
listing's index order) and probes those rows' payloads by primary key: no
GIN index, a cost that follows the window and never the table.
"""

from __future__ import annotations

import re
import secrets
import urllib.parse
from typing import Any

from brooq_py.postgres import Store
from brooq_py.postgres.operator.overview import Overview
from brooq_py.queue import Job
from tests.web.conftest import TOKEN, Board
from tests.web.test_dashboard_http import kill

TOPIC = "web.search"


def shown(body: str) -> list[str]:
    return re.findall(r'data-job="([0-9a-f-]{36})"', body)


def search(board: Board, path: str, payload: str) -> Any:
    sep = "&" if "?" in path else "?"
    return board.request("GET", f"{path}{sep}payload={urllib.parse.quote(payload)}", token=TOKEN)


def test_the_lists_show_an_escaped_preview_of_each_payload(board: Board, store: Store) -> None:
    small = store.enqueue(Job(TOPIC, {"user_id": 7, "html": "<b>hi</b>"})).id
    large = store.enqueue(Job(TOPIC, {"blob": secrets.token_hex(25_000)})).id  # stored > 2 KiB
    body = board.request("GET", f"/jobs?topic={TOPIC}&state=pending", token=TOKEN).body
    assert "&lt;b&gt;hi&lt;/b&gt;" in body and "<b>hi</b>" not in body
    assert "&#34;user_id&#34;: 7" in body.replace("&quot;", "&#34;")
    row = body[body.index(f'data-job="{large}"') :]
    assert "48.8 KiB, on the job's page" in row[: row.index("</tr>")]  # not read, so not shown
    assert small in shown(body)


def test_search_by_payload_containment(board: Board, store: Store, pool: Any) -> None:
    seven = [store.enqueue(Job(TOPIC, {"user_id": 7, "n": n})).id for n in range(3)]
    others = [store.enqueue(Job(TOPIC, {"user_id": 8, "n": n})).id for n in range(3)]
    store.enqueue(Job(TOPIC, "user_id"))  # a scalar payload: contains nothing of an object
    reply = search(board, f"/jobs?topic={TOPIC}&state=pending", '{"user_id": 7}')
    assert reply.status == 200
    assert sorted(shown(reply.body)) == sorted(seven)
    assert "3 matches in the 7 latest pending jobs searched" in reply.body
    assert 'value="{&#34;user_id&#34;: 7}"' in reply.body.replace("&quot;", "&#34;")  # the box keeps it
    # Retry-all and the other actions act on what the search shows: the dead page searches too.
    kill(pool, store.schema, [seven[0], others[0]])
    dead = search(board, "/dead", '{"user_id": 8}')
    assert shown(dead.body) == [others[0]]
    assert 'name="id" value="' + others[0] in dead.body and seven[0] not in dead.body
    none = search(board, f"/jobs?topic={TOPIC}&state=pending", '{"user_id": 99}')
    assert shown(none.body) == [] and "has a payload containing that" in none.body


def test_invalid_json_in_the_search_box_is_a_clear_message_not_a_500(board: Board, store: Store) -> None:
    store.enqueue(Job(TOPIC, {"user_id": 7}))
    for bad in ("{user_id: 7}", "{'a': 1}", "NaN", '{"a": "\\u0000"}', "[" * 3000):
        reply = search(board, f"/jobs?topic={TOPIC}&state=pending", bad)
        assert reply.status == 400, bad
        assert 'id="filter-error"' in reply.body and "payload filter" in reply.body, bad
        assert 'id="payload-filter"' in reply.body  # the form is there to fix it
    assert search(board, "/dead", "{nope").status == 400


def test_the_search_reads_a_bounded_window_and_continues_after_it(store: Store) -> None:
    ids = [store.enqueue(Job(TOPIC, {"user_id": n % 3})).id for n in range(12)]
    overview = Overview(store)
    first = overview.search(TOPIC, "pending", {"user_id": 0}, scan=5, limit=50)
    assert first.scanned == 5 and first.next is not None
    assert [j.id for j in first.jobs] == [i for i in ids[-5:][::-1] if ids.index(i) % 3 == 0]
    seen = [j.id for j in first.jobs]
    cursor = first.next
    while cursor is not None:
        page = overview.search(TOPIC, "pending", {"user_id": 0}, cursor, scan=5, limit=50)
        assert page.scanned <= 5
        seen += [j.id for j in page.jobs]
        cursor = page.next
    assert seen == [i for i in ids[::-1] if ids.index(i) % 3 == 0]
    # More matches than a page holds: the page stops at its limit and goes on from there.
    capped = overview.search(TOPIC, "pending", {}, scan=10, limit=4)
    assert len(capped.jobs) == 4 and capped.scanned == 4
    rest = overview.search(TOPIC, "pending", {}, capped.next, scan=10, limit=4)
    assert [j.id for j in rest.jobs] == ids[::-1][4:8]
