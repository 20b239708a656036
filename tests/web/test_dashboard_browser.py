"""The dashboard in a real headless Chromium, against a real uvicorn and PostgreSQL (issue: browser tests).

Each action is done by clicking and checked in the database. With
``BROOQ_SCREENSHOTS=1`` the suite also writes docs/dashboard-topics.png and
docs/dashboard-job.png, and their 420 px twins ``-narrow``, and docs/dashboard-topics-menu.png
(``make screenshots``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql
from psycopg.types.json import Jsonb
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.common.actions.action_builder import ActionBuilder
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from brooq_py.postgres import Store
from brooq_py.queue import Job, State
from tests.polling import wait_for
from tests.web.conftest import TOKEN, Board
from tests.web.test_dashboard_http import kill

DOCS = Path(__file__).resolve().parents[2] / "docs"


def login(browser: WebDriver, board: Board, token: str = TOKEN, *, accepted: bool = True) -> None:
    """Log in through the form; wait until the dashboard is shown (or, not *accepted*, the refusal)."""
    browser.get(board.url + "/")
    wait_for(lambda: browser.find_elements(By.ID, "token"), "the login form")
    browser.find_element(By.ID, "token").send_keys(token)
    browser.find_element(By.ID, "login").click()
    if accepted:
        wait_for(
            lambda: browser.find_elements(By.CSS_SELECTOR, "table#topics"), "the topics page after login"
        )
    else:
        wait_for(lambda: "not the right one" in browser.page_source, "the refusal")


def cell(browser: WebDriver, topic: str, state: str) -> str:
    """The text of one count, "" while its row is not there."""
    return shown(browser, f'tr[data-topic="{topic}"] td[data-state="{state}"]')


SHOWN = """
const e = document.querySelector(arguments[0]);
if (!e) return '';
return arguments[1] === null ? e.innerText.trim() : (e.getAttribute(arguments[1]) || '');
"""


def shown(browser: WebDriver, css: str, attribute: str | None = None) -> str:
    """The text (or *attribute*) of the first element *css* finds, "" while none is there (a page
    still loading). Found and read in one script: the live refresh swaps the rows every 0.5 s, and
    on a busy machine a find and a read as two commands had a swap between them nearly every time."""
    return str(browser.execute_script(SHOWN, css, attribute))


# The centre of the first element arguments[0] finds, scrolled into view when it is not (as a
# WebDriver click scrolls it); null when none is there, or what is drawn on top of it there.
CENTRE = """
const e = document.querySelector(arguments[0]);
if (!e) return null;
const vw = document.documentElement.clientWidth, vh = document.documentElement.clientHeight;
let r = e.getBoundingClientRect();
if (r.left < 0 || r.top < 0 || r.right > vw || r.bottom > vh) {
  e.scrollIntoView({block: 'end', inline: 'nearest'});
  r = e.getBoundingClientRect();
}
const x = Math.floor((r.left + r.right) / 2), y = Math.floor((r.top + r.bottom) / 2);
const hit = document.elementFromPoint(x, y);
if (!hit || !(hit === e || e.contains(hit)))
  return {covered: hit ? hit.tagName + '.' + hit.className : 'nothing'};
return {x: x, y: y};
"""


def click_at(browser: WebDriver, css: str) -> bool:
    """Click where the first element *css* finds is drawn, as a mouse does; False when none is there.

    The live refresh replaces the topics' rows every 0.5 s (here with the same rows in the same
    places). A click on a found element fails as stale when a swap comes between the find and the
    click, and on a busy machine one came nearly every time; a click at the element's place lands
    on whichever row is drawn there then. It fails when something else covers the element there."""
    where = browser.execute_script(CENTRE, css)
    if where is None:
        return False
    assert "covered" not in where, f"{css} is covered by {where['covered']}"
    actions = ActionBuilder(browser)
    actions.pointer_action.move_to_location(where["x"], where["y"]).click()  # type: ignore[no-untyped-call]
    actions.perform()
    return True


def answer_page(browser: WebDriver, message: str) -> None:
    """Wait until the page shows *message* (it may still be loading); if it never does, say what
    the browser shows instead."""
    try:
        wait_for(lambda: message in browser.page_source, f"the answer page saying {message!r}")
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}: the browser is at {browser.current_url}, showing:\n{browser.page_source[:2000]}"
        ) from None


def click_action(browser: WebDriver, scope: str, action: str) -> None:
    """Click an action's button (again if the live refresh swapped it out under the click), then
    wait for the page the action answers with (a new document: the URL may already say done=)."""
    page = browser.find_element(By.TAG_NAME, "html")

    def navigated() -> bool:
        try:
            page.tag_name  # noqa: B018 - touching a node of the old document raises once it is gone
        except StaleElementReferenceException:
            return "done=" in browser.current_url
        except WebDriverException:
            return False  # the driver answered mid-navigation ("unhandled inspector error"): ask again
        return False

    def click() -> bool:
        try:
            browser.find_element(By.CSS_SELECTOR, f'{scope} button[data-action="{action}"]').click()
        except StaleElementReferenceException:
            return False
        return True

    wait_for(click, f"a click on {action}")
    wait_for(navigated, f"the {action} to come back")


def test_login_is_required(browser: WebDriver, board: Board, store: Store) -> None:
    store.enqueue(Job("web.login", None))
    browser.get(board.url + "/")
    assert "/login" in browser.current_url
    assert not browser.find_elements(By.CSS_SELECTOR, 'tr[data-topic="web.login"]')
    login(browser, board, "wrong-token", accepted=False)
    login(browser, board)
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, 'tr[data-topic="web.login"]'), "the topics page")
    cookie = browser.get_cookie("brooq_session")
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert browser.execute_script("return document.cookie") == ""  # HttpOnly: no script sees it


def test_topics_page_shows_the_right_counts(
    browser: WebDriver, board: Board, store: Store, pool: Any
) -> None:
    for n in range(4):
        store.enqueue(Job("web.counts", {"n": n}))
    dead = [store.enqueue(Job("web.counts", {"d": n})).id for n in range(2)]
    kill(pool, store.schema, dead)
    canceled = store.enqueue(Job("web.counts", None)).id
    store.cancel(canceled)
    store.enqueue(Job("web.other", None))
    login(browser, board)
    expected = {
        ("web.counts", "pending"): "4",
        ("web.counts", "dead"): "2",
        ("web.counts", "canceled"): "1",
        ("web.counts", "processing"): "0",
        ("web.counts", "failed"): "0",
        ("web.other", "pending"): "1",
    }

    # one read of the whole table at a time: the live refresh may swap the rows between two cells
    def shown_as_expected() -> bool:
        seen = counts(browser)
        return all(seen.get(k) == v for k, v in expected.items())

    wait_for(shown_as_expected, f"the counts {expected}")


def counts(browser: WebDriver) -> dict[tuple[str, str], str]:
    """Every count of the topics table, read in one script (one document state)."""
    cells = browser.execute_script(
        "return [...document.querySelectorAll('tr[data-topic] td[data-state]')]"
        ".map(td => [td.closest('tr').dataset.topic, td.dataset.state, td.textContent.trim()])"
    )
    return {(t, st): text for t, st, text in cells}


def test_q1_retry_a_dead_job_by_clicking(browser: WebDriver, board: Board, store: Store, pool: Any) -> None:
    job_id = store.enqueue(Job("web.retry", {"n": 1})).id
    kill(pool, store.schema, [job_id])
    login(browser, board)
    browser.get(board.url + "/dead")
    click_action(browser, f'tr[data-job="{job_id}"]', "retry")
    row = store.get(job_id)
    assert row is not None and row.state == State.PENDING and row.attempts == 0
    answer_page(browser, "Job retried")


def test_x1_cancel_a_pending_job_by_clicking(browser: WebDriver, board: Board, store: Store) -> None:
    job_id = store.enqueue(Job("web.cancel", {"n": 1})).id
    login(browser, board)
    browser.get(f"{board.url}/jobs/{job_id}")
    click_action(browser, ".actions", "cancel")
    assert store.get(job_id).state == State.CANCELED  # type: ignore[union-attr]
    wait_for(lambda: shown(browser, "#state") == "canceled", "the job page saying canceled")


def test_q2_pause_and_resume_a_topic_by_clicking(browser: WebDriver, board: Board, store: Store) -> None:
    store.enqueue(Job("web.pause", None))
    login(browser, board)
    wait_for(lambda: cell(browser, "web.pause", "pending") == "1", "the topic's row")
    open_menu(browser, "web.pause")  # the row's actions are in its menu
    click_action(browser, 'tr[data-topic="web.pause"]', "pause")
    assert store.paused() == {"web.pause"}
    row = 'tr[data-topic="web.pause"] td[data-paused]'
    browser.get(board.url + "/")  # the open menu holds the live refresh off: read the page afresh
    wait_for(lambda: shown(browser, row, "data-paused") == "yes", "the row to show the topic paused")
    open_menu(browser, "web.pause")
    click_action(browser, 'tr[data-topic="web.pause"]', "resume")
    assert store.paused() == set()


def test_pending_count_rises_without_a_reload(browser: WebDriver, board: Board, store: Store) -> None:
    store.enqueue(Job("web.live", None))
    login(browser, board)
    wait_for(lambda: cell(browser, "web.live", "pending") == "1", "the first count")
    browser.execute_script("window.__sameDocument = 'yes'")
    store.enqueue_many([Job("web.live", {"n": n}) for n in range(5)])
    wait_for(lambda: cell(browser, "web.live", "pending") == "6", "the count to rise to 6 by itself")
    assert browser.execute_script("return window.__sameDocument") == "yes"  # no reload happened


def test_read_only_shows_no_action(
    browser: WebDriver, serve_board: Callable[..., Board], store: Store, pool: Any
) -> None:
    board = serve_board(token=TOKEN, read_only=True)
    pending = store.enqueue(Job("web.ro", None)).id
    dead = store.enqueue(Job("web.ro", None)).id
    kill(pool, store.schema, [dead])
    login(browser, board)
    wait_for(lambda: cell(browser, "web.ro", "pending") == "1", "the topics page")
    for path in ("/", f"/jobs/{pending}", f"/jobs/{dead}", "/dead", "/jobs?topic=web.ro&state=pending"):
        browser.get(board.url + path)
        assert browser.find_elements(By.ID, "read-only"), path
        assert browser.find_elements(By.CSS_SELECTOR, "button[data-action]") == [], path
        assert browser.find_elements(By.CSS_SELECTOR, "form[action*='/action/']") == [], path


def test_a_script_in_a_payload_is_shown_as_text(browser: WebDriver, board: Board, store: Store) -> None:
    evil = "<script>window.__xss = 1</script><img src=x onerror=window.__xss=2>"
    job_id = store.enqueue(Job("web.xss", {"html": evil})).id
    login(browser, board)
    browser.get(f"{board.url}/jobs/{job_id}")
    payload = browser.find_element(By.ID, "payload").text
    assert evil in payload
    assert browser.execute_script("return window.__xss === undefined")
    assert browser.find_elements(By.CSS_SELECTOR, "#payload script, #payload img") == []


def fill_a_realistic_queue(store: Store, pool: Any) -> str:
    """Five topics of done, pending and dead jobs over the last hour, one paused, one limited;
    return the id of a dead webhook job with a payload and an error."""
    job = sql.Identifier(store.schema, "job")
    shape = {
        "email.send": (1840, 7, 3),
        "billing.invoice": (410, 0, 1),
        "image.resize": (9120, 64, 0),
        "search.reindex": (36, 0, 0),
        "webhooks.deliver": (2210, 12, 9),
    }
    with pool.connection() as conn:
        for topic, (done, pending, dead) in shape.items():
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (topic, payload, state, attempts, updated_at, last_error) "
                    "SELECT %s, jsonb_build_object('n', n), s, 1, now() - (random() ^ 1.6) * interval '59 minutes', "
                    "CASE WHEN s = 'dead' THEN 'TimeoutError: upstream did not answer in 30s' END "
                    "FROM generate_series(1, %s) AS n, "
                    "LATERAL (SELECT CASE WHEN n <= %s THEN 'pending' WHEN n <= %s THEN 'dead' ELSE 'done' END) AS x(s)"
                ).format(job),
                (topic, done + pending + dead, pending, pending + dead),
            )
            conn.execute(
                sql.SQL(
                    "UPDATE {} SET available_at = now() - interval '95 seconds' WHERE topic = %s AND state = 'pending'"
                ).format(job),
                (topic,),
            )
    store.pause("search.reindex")
    store.set_limit("billing.invoice", 4)
    store.set_rate_limit("email.send", 50, 1)
    store.set_max_depth("image.resize", 100_000)
    invoice = store.enqueue(Job("billing.invoice", {"order": 4711})).id
    job_id = store.enqueue(
        Job(
            "webhooks.deliver",
            {
                "url": "https://hooks.example.com/orders",
                "event": "order.paid",
                "order": {"id": 4711, "total": "19.90"},
            },
            idempotency_key="order.paid-4711",
            after=[invoice],
        )
    ).id
    error = "TimeoutError: POST https://hooks.example.com/orders did not answer in 30s"
    kill(pool, store.schema, [job_id], error)
    trace = (
        "Traceback (most recent call last):\n"
        '  File "shop/hooks.py", line 41, in deliver\n'
        "    response = client.post(url, json=event, timeout=30)\n"
        '  File "httpx/_client.py", line 1144, in post\n'
        "    return self.request(...)\n"
        f"{error}\n"
    )
    attempts = [{"attempt": n, "error": error, "traceback": trace} for n in (1, 2, 3)]
    with pool.connection() as conn:  # its parent done, its three attempts as the engine records them
        conn.execute(
            sql.SQL("UPDATE {} SET state = 'done', updated_at = now() WHERE id = %s").format(job),
            (invoice,),
        )
        conn.execute(
            sql.SQL(
                "UPDATE {} SET errors = (SELECT jsonb_agg(e || jsonb_build_object('at', "
                "now() - (4 - (e->>'attempt')::int) * interval '3 minutes')) FROM jsonb_array_elements(%s) e) "
                "WHERE id = %s"
            ).format(job),
            (Jsonb(attempts), job_id),
        )
    return job_id


OVERFLOW = """
const doc = document.documentElement;
const clipped = [...document.querySelectorAll('table, pre, dl, form, .card')]
  .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
  .map(e => e.tagName + (e.id ? '#' + e.id : ''));
return {scroll: doc.scrollWidth, inner: window.innerWidth, clipped: clipped};
"""


@pytest.mark.parametrize("width", [1280, 420])
def test_no_page_is_wider_than_the_window(
    width: int, browser: WebDriver, board: Board, store: Store, pool: Any
) -> None:
    job_id = fill_a_realistic_queue(store, pool)
    canceled = store.enqueue(Job("email.send", {"to": "a@example.com"})).id
    store.cancel(canceled)
    tenants(store)
    login(browser, board)
    browser.set_window_size(width, 900)
    try:
        for path in (
            "/",
            f"/jobs/{job_id}",
            f"/jobs/{canceled}",
            "/dead",
            "/jobs?topic=email.send&state=pending",
            '/jobs?topic=email.send&state=pending&payload={"n": 3}',
            "/dead?payload={nope",
            f"/topics/{TENANT_TOPIC}/tenants",
        ):
            browser.get(board.url + path)
            wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "main"), path)
            seen = browser.execute_script(OVERFLOW)
            assert seen["scroll"] <= seen["inner"], (width, path, seen)
            assert seen["clipped"] == [], (width, path, seen)
    finally:
        browser.set_window_size(1440, 900)


# Every control shown in *root* (a visible button, summary, field or link), scrolled into view:
# its box must lie inside the viewport and inside every ancestor that clips, its text must fit
# its box, and the point at its centre must hit it (or a node inside it), not something on top.
CONTROLS_FIT = """
const root = arguments[0] || document;
const vw = document.documentElement.clientWidth, vh = document.documentElement.clientHeight;
const name = e => e.tagName.toLowerCase() + (e.dataset.action ? '[' + e.dataset.action + ']' : '')
  + ' "' + (e.innerText || e.value || e.getAttribute('aria-label') || '').trim().slice(0, 30) + '"';
const bad = [];
let seen = 0;
for (const e of root.querySelectorAll('button, summary, input:not([type=hidden]), select, textarea, a')) {
  const closed = e.closest('details:not([open])');
  if (closed && e.parentElement !== closed) continue;  // inside a closed menu: not shown
  if (!e.checkVisibility({visibilityProperty: true})) continue;
  seen++;
  e.scrollIntoView({block: 'nearest', inline: 'nearest'});
  const r = e.getBoundingClientRect();
  if (r.left < -0.5 || r.top < -0.5 || r.right > vw + 0.5 || r.bottom > vh + 0.5) {
    bad.push(name(e) + ' outside the viewport ' + JSON.stringify([r.left, r.top, r.right, r.bottom, vw, vh]));
    continue;
  }
  const box = e.closest('.menu-panel, .card');  // the panel it is drawn on: it must not stick out
  if (box) {
    const c = box.getBoundingClientRect();
    if (r.left < c.left - 0.5 || r.right > c.right + 0.5 || r.top < c.top - 0.5 || r.bottom > c.bottom + 0.5)
      bad.push(name(e) + ' sticks out of its ' + box.className);
  }
  for (let a = e.parentElement; a && a !== document.body; a = a.parentElement) {
    const style = getComputedStyle(a);
    if (style.overflowX === 'visible' && style.overflowY === 'visible') continue;
    const c = a.getBoundingClientRect();
    if (r.left < c.left - 0.5 || r.right > c.right + 0.5 || r.top < c.top - 0.5 || r.bottom > c.bottom + 0.5)
      bad.push(name(e) + ' clipped by ' + a.tagName + '.' + a.className);
  }
  if (e.matches('button, summary') && e.scrollWidth > e.clientWidth + 1)
    bad.push(name(e) + ' text cut: ' + e.scrollWidth + ' > ' + e.clientWidth);
  const hit = document.elementFromPoint((r.left + r.right) / 2, (r.top + r.bottom) / 2);
  if (!hit || !(hit === e || e.contains(hit)))
    bad.push(name(e) + ' covered by ' + (hit ? hit.tagName + '.' + hit.className : 'nothing'));
}
return {seen: seen, bad: bad};
"""


def assert_controls_fit(browser: WebDriver, where: str, root: Any = None) -> int:
    """Check CONTROLS_FIT inside *root* (the whole page when None); return how many were checked."""
    seen = browser.execute_script(CONTROLS_FIT, root)
    assert seen["bad"] == [], (where, seen["bad"])
    return int(seen["seen"])


def open_menu(browser: WebDriver, name: str) -> Any:
    """Open the action menu of a topic (or tenant) by clicking its summary, again until it is open
    (a swap of the rows between the press and the release makes no click); return it. An open menu
    holds the live refresh off, so the element returned stays the one shown."""
    menu = f'details.menu[data-menu="{name}"]'

    def opened() -> Any:
        found = browser.find_elements(By.CSS_SELECTOR, menu + "[open]")
        if found:
            return found[0]
        click_at(browser, menu + " > summary")  # only when closed: a click on an open one closes it
        return None

    return wait_for(opened, f"the {name} menu to open", 60)


@pytest.mark.parametrize("width", [1280, 420])
def test_topics_controls_fit_unclipped_and_unobscured_menus_open_too(
    width: int, browser: WebDriver, board: Board, store: Store, pool: Any
) -> None:
    """Issue: at 1280 px the Rate, Depth and Pause buttons were cut and a topic took three lines."""
    fill_a_realistic_queue(store, pool)
    login(browser, board)
    browser.set_window_size(width, 800 if width > 500 else 900)
    try:
        browser.get(board.url + "/")
        wait_for(lambda: cell(browser, "email.send", "pending") == "7", "the topics page")
        topics = ["billing.invoice", "email.send", "image.resize", "search.reindex", "webhooks.deliver"]
        # A table: one line per topic, as tall as its tallest value, the chart (three lines of
        # controls made it 110 px).
        if width > 500:
            heights = browser.execute_script(
                "return [...document.querySelectorAll('tr[data-topic]')].map(r => r.getBoundingClientRect().height)"
            )
            assert len(heights) == len(topics) and max(heights) <= 60, heights
        assert assert_controls_fit(browser, f"{width} closed") >= len(topics) * 10
        for topic in topics:

            def opened_and_checked(topic: str = topic) -> Any:
                """The open menu, checked; None when a refresh already in flight swapped its row."""
                menu = open_menu(browser, topic)
                try:
                    panel = menu.find_element(By.CLASS_NAME, "menu-panel")
                    # Pause or Resume, the rate and depth fields and their Set buttons, the link
                    # to the topic's tenants, and the summary.
                    assert assert_controls_fit(browser, f"{width} {topic} menu", menu) == 7
                    assert panel.is_displayed()
                except StaleElementReferenceException:
                    return None
                return menu

            menu = wait_for(opened_and_checked, f"the {topic} menu open and checked")
            # The open menu holds off the live refresh: it is still open after two refresh periods.
            browser.execute_script("window.__menu = arguments[0]", menu)
            time.sleep(1.2)  # the board refreshes every 0.5 s
            assert browser.execute_script("return window.__menu.isConnected && window.__menu.open")
            browser.find_element(By.TAG_NAME, "body").send_keys("\ue00c")  # Escape closes it
            wait_for(lambda: not browser.execute_script("return window.__menu.open"), "the menu to close")
    finally:
        browser.set_window_size(1440, 900)


TENANT_TOPIC = "reports.render"
LONG_TENANT = "customer-" + "w" * 246  # the longest a tenant may be: 255 bytes


def tenants(store: Store) -> None:
    """A tenant topic: a few tenants (one with the longest name), jobs of no tenant, settings."""
    for i, tenant in enumerate(("acme", "globex", LONG_TENANT, None)):
        store.enqueue_many([Job(TENANT_TOPIC, {"n": n}, tenant=tenant) for n in range(3 + i)])
    store.set_tenant_limit(TENANT_TOPIC, 4)
    store.set_tenant_rate_limit(TENANT_TOPIC, 30, 60, tenant="acme")


@pytest.mark.parametrize("width", [1280, 420])
def test_tenants_page_controls_fit_and_a_limit_is_set_by_clicking(
    width: int, browser: WebDriver, board: Board, store: Store
) -> None:
    tenants(store)
    login(browser, board)
    browser.set_window_size(width, 800 if width > 500 else 900)
    try:
        browser.get(board.url + "/")
        link = f'tr[data-topic="{TENANT_TOPIC}"] a.tenants-link'
        wait_for(lambda: shown(browser, link), "the topic's tenants link")

        def follow() -> bool:  # again until the tenants page is shown
            try:
                if browser.find_elements(By.CSS_SELECTOR, "table#tenants"):
                    return True
                click_at(browser, link)
            except WebDriverException:  # the document went away mid-navigation: look again
                pass
            return False

        wait_for(follow, "the tenants page", 60)
        seen = browser.execute_script(OVERFLOW)
        assert seen["scroll"] <= seen["inner"] and seen["clipped"] == [], (width, seen)
        # The defaults' two fields and buttons, a summary per tenant, the by-name form's four.
        assert assert_controls_fit(browser, f"{width} tenants") >= 4 + 3 + 4
        for tenant in ("acme", LONG_TENANT):
            menu = open_menu(browser, tenant)
            # Its limit, rate and weight fields, their Set buttons, and the summary.
            assert assert_controls_fit(browser, f"{width} {tenant[:20]} menu", menu) == 7
            if tenant == LONG_TENANT:
                field = menu.find_element(By.CSS_SELECTOR, 'input[name="value"][id$="-limit"]')
                field.clear()
                field.send_keys("2")
                click_action(browser, f'details.menu[data-menu="{tenant}"]', "tenant-limit")
            else:
                menu.find_element(By.TAG_NAME, "summary").click()
        answer_page(browser, "Limit of tenant")
        assert [t.limit for t in store.flow.tenants(TENANT_TOPIC) if t.tenant == LONG_TENANT] == [2]
        assert browser.current_url.split("?")[0].endswith(f"/topics/{TENANT_TOPIC}/tenants")
    finally:
        browser.set_window_size(1440, 900)


def test_set_a_rate_limit_from_the_menu(browser: WebDriver, board: Board, store: Store) -> None:
    store.enqueue(Job("web.menu", None))
    login(browser, board)
    wait_for(lambda: cell(browser, "web.menu", "pending") == "1", "the topic's row")
    menu = open_menu(browser, "web.menu")
    field = menu.find_element(By.CSS_SELECTOR, 'form[action$="/action/rate"] input[name="value"]')
    field.clear()
    field.send_keys("7/1s")
    click_action(browser, 'details.menu[data-menu="web.menu"]', "rate")
    (setting,) = store.topic_settings()
    assert (setting.rate_limit, setting.rate_per) == (7, 1.0)
    answer_page(browser, "Rate limit set")


@pytest.mark.parametrize("width", [1280, 420])
def test_job_page_controls_fit_with_history_and_graph(
    width: int, browser: WebDriver, board: Board, store: Store, pool: Any
) -> None:
    job_id = fill_a_realistic_queue(store, pool)
    parent = store.enqueue(Job("web.graph", {"step": "parent"})).id
    child = store.enqueue(Job("web.graph", {"step": "child"}, after=[parent])).id
    login(browser, board)
    browser.set_window_size(width, 800 if width > 500 else 900)
    try:
        for page in (job_id, parent, child):
            browser.get(f"{board.url}/jobs/{page}")
            wait_for(lambda: browser.find_elements(By.ID, "state"), "the job page")
            assert_controls_fit(browser, f"{width} job {page}")  # the tracebacks folded
            for folded in browser.find_elements(By.CSS_SELECTOR, "details.traceback"):
                folded.find_element(By.TAG_NAME, "summary").click()
            assert_controls_fit(browser, f"{width} job {page} unfolded")
            if page == job_id:  # the dead webhook: three attempts, the latest first, and its parent
                shown = [
                    a.get_attribute("data-attempt")
                    for a in browser.find_elements(By.CSS_SELECTOR, ".attempt")
                ]
                assert shown == ["3", "2", "1"]
                assert "did not answer in 30s" in browser.find_element(By.ID, "errors").text
                assert "in deliver" in browser.find_element(By.ID, "errors").text
                assert browser.find_element(By.ID, "no-result").text == "Ended dead: no result."
                boxes = browser.find_elements(By.CSS_SELECTOR, '#graph a.graph-box[data-relative="parent"]')
                assert [b.get_attribute("data-state") for b in boxes] == ["done"]
        assert browser.find_elements(By.CSS_SELECTOR, f'#graph a.graph-box[href$="/jobs/{parent}"]')
    finally:
        browser.set_window_size(1440, 900)


@pytest.mark.skipif(
    not os.environ.get("BROOQ_SCREENSHOTS"), reason="screenshots are written by make screenshots"
)
def test_screenshots_of_the_topics_and_job_pages(
    browser: WebDriver, board: Board, store: Store, pool: Any
) -> None:
    """Fill a realistic queue, then save the topics and job pages at 1280 and 420 px into docs/."""
    job_id = fill_a_realistic_queue(store, pool)
    login(browser, board)
    wait_for(lambda: cell(browser, "email.send", "pending") == "7", "the topics page")
    DOCS.mkdir(exist_ok=True)
    try:
        for width, suffix in ((1280, ""), (420, "-narrow")):
            browser.set_window_size(width, 760 if width > 500 else 1400)
            browser.get(board.url + "/")
            wait_for(lambda: cell(browser, "email.send", "pending") == "7", "the topics page")
            browser.save_screenshot(str(DOCS / f"dashboard-topics{suffix}.png"))
            if not suffix:  # a topic's actions menu, open
                open_menu(browser, "email.send")
                browser.save_screenshot(str(DOCS / "dashboard-topics-menu.png"))
            browser.set_window_size(width, 1180 if width > 500 else 2000)
            browser.get(f"{board.url}/jobs/{job_id}")
            browser.save_screenshot(str(DOCS / f"dashboard-job{suffix}.png"))
    finally:
        browser.set_window_size(1440, 900)
