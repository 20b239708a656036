"""The dashboard in a real headless Chromium, against a real uvicorn and PostgreSQL (issue: browser tests).

Each action is done by clicking and checked in the database. With
``BROOQ_SCREENSHOTS=1`` the suite also writes docs/dashboard-topics.png and
docs/dashboard-job.png, and their 420 px twins ``-narrow`` (``make screenshots``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql
from selenium.common.exceptions import StaleElementReferenceException
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
    """The text of one count, or "" while the live refresh is swapping the rows."""
    return shown(browser, f'tr[data-topic="{topic}"] td[data-state="{state}"]')


def shown(browser: WebDriver, css: str, attribute: str | None = None) -> str:
    """The text (or *attribute*) of the first element *css* finds, "" while none is there (a page
    still loading, rows the live refresh is swapping)."""
    try:
        found = browser.find_elements(By.CSS_SELECTOR, css)
        if not found:
            return ""
        return str(found[0].text if attribute is None else found[0].get_attribute(attribute))
    except StaleElementReferenceException:
        return ""


def click_action(browser: WebDriver, scope: str, action: str) -> None:
    """Click an action's button (again if the live refresh swapped it out under the click), then
    wait for the page the action answers with (a new document: the URL may already say done=)."""
    page = browser.find_element(By.TAG_NAME, "html")

    def navigated() -> bool:
        try:
            page.tag_name  # noqa: B018 - touching a node of the old document raises once it is gone
        except StaleElementReferenceException:
            return "done=" in browser.current_url
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
    wait_for(lambda: cell(browser, "web.counts", "pending") == "4", "pending 4")
    assert cell(browser, "web.counts", "dead") == "2"
    assert cell(browser, "web.counts", "canceled") == "1"
    assert cell(browser, "web.counts", "processing") == "0"
    assert cell(browser, "web.counts", "failed") == "0"
    assert cell(browser, "web.other", "pending") == "1"


def test_q1_retry_a_dead_job_by_clicking(browser: WebDriver, board: Board, store: Store, pool: Any) -> None:
    job_id = store.enqueue(Job("web.retry", {"n": 1})).id
    kill(pool, store.schema, [job_id])
    login(browser, board)
    browser.get(board.url + "/dead")
    click_action(browser, f'tr[data-job="{job_id}"]', "retry")
    row = store.get(job_id)
    assert row is not None and row.state == State.PENDING and row.attempts == 0
    assert "Job retried" in browser.page_source


def test_x1_cancel_a_pending_job_by_clicking(browser: WebDriver, board: Board, store: Store) -> None:
    job_id = store.enqueue(Job("web.cancel", {"n": 1})).id
    login(browser, board)
    browser.get(f"{board.url}/jobs/{job_id}")
    click_action(browser, ".actions", "cancel")
    assert store.get(job_id).state == State.CANCELED  # type: ignore[union-attr]
    assert browser.find_element(By.ID, "state").text == "canceled"


def test_q2_pause_and_resume_a_topic_by_clicking(browser: WebDriver, board: Board, store: Store) -> None:
    store.enqueue(Job("web.pause", None))
    login(browser, board)
    wait_for(lambda: cell(browser, "web.pause", "pending") == "1", "the topic's row")
    click_action(browser, 'tr[data-topic="web.pause"]', "pause")
    assert store.paused() == {"web.pause"}
    row = 'tr[data-topic="web.pause"] td[data-paused]'
    wait_for(lambda: shown(browser, row, "data-paused") == "yes", "the row to show the topic paused")
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
    job_id = store.enqueue(
        Job(
            "webhooks.deliver",
            {
                "url": "https://hooks.example.com/orders",
                "event": "order.paid",
                "order": {"id": 4711, "total": "19.90"},
            },
            idempotency_key="order.paid-4711",
        )
    ).id
    kill(
        pool,
        store.schema,
        [job_id],
        "TimeoutError: POST https://hooks.example.com/orders did not answer in 30s",
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
    login(browser, board)
    browser.set_window_size(width, 900)
    try:
        for path in (
            "/",
            f"/jobs/{job_id}",
            f"/jobs/{canceled}",
            "/dead",
            "/jobs?topic=email.send&state=pending",
        ):
            browser.get(board.url + path)
            wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "main"), path)
            seen = browser.execute_script(OVERFLOW)
            assert seen["scroll"] <= seen["inner"], (width, path, seen)
            assert seen["clipped"] == [], (width, path, seen)
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
            browser.set_window_size(width, 820 if width > 500 else 1400)
            browser.get(f"{board.url}/jobs/{job_id}")
            browser.save_screenshot(str(DOCS / f"dashboard-job{suffix}.png"))
    finally:
        browser.set_window_size(1440, 900)
