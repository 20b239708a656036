"""A topic's tenants page (SPEC T1-T3, K5) over real HTTP on a real uvicorn and PostgreSQL: the
counts, the busiest first and bounded, the forms an operator sets them with, and what a viewer or a
bad value gets."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any
from urllib.parse import quote

from psycopg import sql

from brooq_py.http.dashboard import TENANTS_SHOWN
from brooq_py.postgres import Store
from brooq_py.queue import Job
from tests.web.conftest import TOKEN, Board
from tests.web.test_dashboard_http import csrf_of

TOPIC = "web.tenants"
PAGE = f"/topics/{TOPIC}/tenants"
VIEWER = "viewer-9c0d17"


def rows(html: str) -> list[tuple[str, str, str]]:
    """(tenant, waiting, running) of each row of the tenants table, in order ("" for no tenant)."""
    found = re.findall(
        r'<tr data-tenant="([^"]*)"[^>]*>.*?data-label="waiting">([^<]*)<.*?data-label="running">([^<]*)<',
        html,
        re.S,
    )
    return [(t, w, r) for t, w, r in found]


def claim(store: Store, n: int) -> None:
    """Claim *n* jobs of TOPIC as an engine does: round-robin across its tenants."""
    assert any(s.topic == TOPIC and s.tenants for s in store.worker.topic_settings())
    assert len(store.worker.claim_limited(TOPIC, n, "w", timedelta(seconds=30))) == n


def settings(pool: Any, schema: str) -> list[tuple[Any, ...]]:
    """Every tenant setting of the schema and the topic's defaults, to see that nothing changed."""
    with pool.connection() as conn:
        own = conn.execute(
            sql.SQL(
                "SELECT tenant, weight, concurrency_limit, rate_limit, rate_per FROM {} ORDER BY tenant"
            ).format(sql.Identifier(schema, "tenant_setting"))
        ).fetchall()
        defaults = conn.execute(
            sql.SQL("SELECT topic, tenant_limit, tenant_rate_limit FROM {} ORDER BY topic").format(
                sql.Identifier(schema, "topic_setting")
            )
        ).fetchall()
    return [*own, *defaults]


def test_the_page_lists_the_tenants_busiest_first_with_their_counts(board: Board, store: Store) -> None:
    store.enqueue_many([Job(TOPIC, {"i": i}, tenant="acme") for i in range(5)])
    store.enqueue_many([Job(TOPIC, {"i": i}, tenant="<b>globex</b>") for i in range(2)])
    store.enqueue_many([Job(TOPIC, {"i": i}, tenant="initech") for i in range(1)])
    store.enqueue_many([Job(TOPIC, {"i": i}) for i in range(3)])  # the tenant of no name
    store.set_tenant_limit(TOPIC, 4)
    store.set_tenant_rate_limit(TOPIC, 9, 60, tenant="initech")
    store.set_tenant_weight(TOPIC, "dormant", 3)  # settings, no jobs
    claim(store, 4)  # one of each tenant, the one of no name too
    page = board.request("GET", PAGE, token=TOKEN)
    assert page.status == 200
    assert rows(page.body) == [
        ("", "2", "1"),
        ("acme", "4", "1"),
        ("&lt;b&gt;globex&lt;/b&gt;", "1", "1"),
        ("initech", "0", "1"),
        ("dormant", "0", "0"),
    ]
    assert "<b>globex" not in page.body  # escaped
    assert 'id="unnamed"' in page.body and ">no tenant<" in page.body
    assert re.search(r'id="default-limit">4<', page.body)
    assert re.search(r'id="default-rate">none<', page.body)
    initech = re.search(r'<tr data-tenant="initech">(.*?)</tr>', page.body, re.S)
    assert initech is not None and 'data-own="9/1m"' in initech.group(1)
    dormant = re.search(r'<tr data-tenant="dormant">(.*?)</tr>', page.body, re.S)
    assert dormant is not None and 'data-label="weight" data-own="3">3<' in dormant.group(1)
    assert 'id="hidden"' not in page.body
    # The topics table links to it, as a badge in the topic's cell: its jobs name tenants.
    topics = board.request("GET", "/", token=TOKEN).body
    row = re.search(rf'<tr data-topic="{re.escape(TOPIC)}">(.*?)</tr>', topics, re.S)
    assert row is not None and f'class="badge tenants-link" href="{PAGE}"' in row.group(1)


def test_a_topic_without_tenants_says_so_and_its_row_has_only_the_menu_link(
    board: Board, store: Store
) -> None:
    store.enqueue(Job("web.plain", None))
    page = board.request("GET", "/topics/web.plain/tenants", token=TOKEN)
    assert page.status == 200 and 'id="no-tenants"' in page.body and rows(page.body) == []
    topics = board.request("GET", "/", token=TOKEN).body
    row = re.search(r'<tr data-topic="web.plain">(.*?)</tr>', topics, re.S)
    assert row is not None and "tenants-link" not in row.group(1)
    assert 'href="/topics/web.plain/tenants" data-link="tenants"' in row.group(1)  # in the menu


def test_thousands_of_tenants_show_the_busiest_and_say_how_many_are_not(board: Board, store: Store) -> None:
    many = TENANTS_SHOWN + 37
    store.enqueue_many([Job(TOPIC, {"i": i}, tenant=f"t{i:04d}") for i in range(many)])
    store.enqueue_many([Job(TOPIC, {"i": i}, tenant="zz-busy") for i in range(3)])
    page = board.request("GET", PAGE, token=TOKEN)
    assert page.status == 200
    shown = rows(page.body)
    assert len(shown) == TENANTS_SHOWN
    assert shown[0] == ("zz-busy", "3", "0")  # last by name, first by its jobs
    assert re.search(r'id="hidden">38 more not shown<', page.body), page.body[:3000]


def test_a_topic_with_a_slash_and_odd_characters_has_its_page(board: Board, store: Store) -> None:
    topic = "a/b ?#%.."
    store.enqueue(Job(topic, None, tenant="x"))
    path = "/topics/" + quote(topic, safe="") + "/tenants"
    page = board.request("GET", path, token=TOKEN)
    assert page.status == 200 and rows(page.body) == [("x", "1", "0")]
    topics = board.request("GET", "/", token=TOKEN).body
    assert f'href="{path}"' in topics
    assert board.request("GET", "/topics/a%00b/tenants", token=TOKEN).status == 400


def test_an_operator_sets_a_tenant_limit_and_the_defaults_through_the_forms(
    board: Board, store: Store, pool: Any
) -> None:
    store.enqueue_many([Job(TOPIC, {"i": i}, tenant="acme") for i in range(2)])
    session = board.login()
    page = board.request("GET", PAGE, cookie=session)
    assert page.status == 200
    csrf = csrf_of(page.body)
    assert set(re.findall(r'name="back" value="([^"]*)"', page.body)) == {PAGE}
    for form, message in (
        ({"tenant": "acme", "what": "limit", "value": "3"}, "Limit of tenant 'acme' set"),
        ({"tenant": "acme", "what": "rate", "value": "20/1m"}, "Rate limit of tenant 'acme' set"),
        ({"tenant": "acme", "what": "weight", "value": "5"}, "Weight of tenant 'acme' set"),
        ({"what": "limit", "value": "7"}, "Limit of every tenant's default set"),
        ({"what": "rate", "value": "10/1s"}, "Rate limit of every tenant's default set"),
        ({"tenant": "later", "what": "limit", "value": "1"}, "Limit of tenant 'later' set"),  # by name
    ):
        done = board.request(
            "POST",
            "/action/tenant",
            form={"topic": TOPIC, "csrf": csrf, "back": PAGE, **form},
            cookie=session,
        )
        assert done.status == 303, done.body[:500]
        assert done.location.startswith(PAGE + "?done="), done.location
        back = board.request("GET", done.location, cookie=session)
        assert back.status == 200 and f'<div class="flash" role="status">{message}' in back.body.replace(
            "&#39;", "'"
        )
    (acme,) = [t for t in store.flow.tenants(TOPIC) if t.tenant == "acme"]
    assert (acme.limit, acme.rate, acme.weight) == (3, "20/1m", 5)
    assert ("later", None, 1, None, None) in settings(pool, store.schema)
    assert (TOPIC, 7, 10) in settings(pool, store.schema)
    page = board.request("GET", PAGE, cookie=session).body
    assert re.search(r'id="default-limit">7<', page) and re.search(r'id="default-rate">10/1s<', page)
    # An empty value removes a setting.
    done = board.request(
        "POST",
        "/action/tenant",
        form={"topic": TOPIC, "tenant": "acme", "what": "limit", "value": "", "csrf": csrf, "back": PAGE},
        cookie=session,
    )
    assert done.status == 303 and "removed" in done.location
    (acme,) = [t for t in store.flow.tenants(TOPIC) if t.tenant == "acme"]
    assert acme.limit is None and acme.weight == 5
    # Without the session's CSRF token nothing is set.
    refused = board.request(
        "POST",
        "/action/tenant",
        form={"topic": TOPIC, "tenant": "acme", "what": "limit", "value": "9", "back": PAGE},
        cookie=session,
    )
    assert refused.status == 403
    (acme,) = [t for t in store.flow.tenants(TOPIC) if t.tenant == "acme"]
    assert acme.limit is None


def test_a_viewer_sees_the_page_without_forms_and_is_refused(
    serve_board: Any, store: Store, pool: Any
) -> None:
    board = serve_board(token=TOKEN, viewer_token=VIEWER)
    store.enqueue(Job(TOPIC, None, tenant="acme"))
    before = settings(pool, store.schema)
    page = board.request("GET", PAGE, token=VIEWER)
    assert page.status == 200 and rows(page.body) == [("acme", "1", "0")]
    assert "/action/" not in page.body and "<form" not in page.body.split("</header>")[1]
    session = board.login(VIEWER)
    csrf = csrf_of(board.request("GET", "/", cookie=session).body)
    for form in ({"tenant": "acme", "what": "limit", "value": "3"}, {"what": "rate", "value": "1/1s"}):
        reply = board.request("POST", "/action/tenant", form={"topic": TOPIC, **form}, token=VIEWER)
        assert reply.status == 403 and "may read, not act" in reply.body
        reply = board.request(
            "POST", "/action/tenant", form={"topic": TOPIC, "csrf": csrf, **form}, cookie=session
        )
        assert reply.status == 403
    assert settings(pool, store.schema) == before
    # A read-only dashboard shows no form to its operator either, and refuses the action.
    read_only = serve_board(token=TOKEN, read_only=True)
    assert "/action/" not in read_only.request("GET", PAGE, token=TOKEN).body
    form = {"topic": TOPIC, "tenant": "acme", "what": "limit", "value": "3"}
    assert read_only.request("POST", "/action/tenant", form=form, token=TOKEN).status == 403
    assert settings(pool, store.schema) == before


def test_bad_input_is_a_4xx_saying_why_and_changes_nothing(board: Board, store: Store, pool: Any) -> None:
    store.enqueue(Job(TOPIC, None, tenant="acme"))
    store.set_tenant_limit(TOPIC, 2, tenant="acme")
    before = settings(pool, store.schema)
    long_tenant = "x" * 5000
    for form, status, says in (
        ({"tenant": "acme", "what": "limit", "value": "three"}, 400, "invalid limit 'three'"),
        ({"tenant": "acme", "what": "limit", "value": "-1"}, 400, "invalid limit '-1'"),
        ({"what": "limit", "value": "2.5"}, 400, "invalid limit '2.5'"),
        ({"tenant": "acme", "what": "rate", "value": "-5/1s"}, 400, "invalid rate"),
        ({"tenant": "acme", "what": "rate", "value": "5/soon"}, 400, "invalid rate '5/soon'"),
        ({"tenant": "acme", "what": "weight", "value": "0"}, 400, "invalid weight '0'"),
        ({"what": "weight", "value": "2"}, 400, "a weight is a named tenant"),
        ({"tenant": long_tenant, "what": "limit", "value": "3"}, 400, "at most 255 are allowed"),
        ({"tenant": "", "what": "limit", "value": "3"}, 400, "tenant must not be empty"),
        ({"tenant": "acme", "what": "colour", "value": "3"}, 400, "expected what=limit, rate or weight"),
        ({"tenant": "acme", "value": "3"}, 400, "expected one what"),
    ):
        reply = board.request("POST", "/action/tenant", form={"topic": TOPIC, **form}, token=TOKEN)
        assert reply.status == status, (form.get("value"), reply.status)
        assert says in reply.body.replace("&#39;", "'"), (says, reply.body[-1500:])
        assert long_tenant not in reply.body
    assert settings(pool, store.schema) == before
