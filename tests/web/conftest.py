"""The dashboard on a real uvicorn (a free loopback port) over a real Store, and a real headless Chromium."""

from __future__ import annotations

import http.client
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import pytest

from brooq_py.http.server import ThreadedUvicorn
from brooq_py.postgres import Store
from brooq_py.web import dashboard

TOKEN = "dash-t0ken-2f8a61"
CHROMIUM = os.environ.get("BROOQ_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("BROOQ_CHROMEDRIVER", "/usr/bin/chromedriver")


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    cookies: list[str]
    body: str

    @property
    def location(self) -> str:
        return self.headers.get("location", "")


@dataclass
class Board:
    """A running dashboard: ``url`` is its root (mounted at ``prefix``)."""

    url: str
    port: int
    prefix: str = ""
    cookie: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def request(
        self,
        method: str,
        path: str,
        *,
        form: dict[str, Any] | list[tuple[str, str]] | None = None,
        token: str | None = None,
        cookie: str | None = None,
    ) -> Reply:
        from urllib.parse import urlencode

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers: dict[str, str] = {}
        body = None
        if form is not None:
            body = urlencode(form, doseq=True)
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        if cookie is not None:
            headers["Cookie"] = cookie
        try:
            conn.request(method, self.prefix + path, body=body, headers=headers)
            resp = conn.getresponse()
            cookies = [v for k, v in resp.getheaders() if k.lower() == "set-cookie"]
            return Reply(
                resp.status, {k.lower(): v for k, v in resp.getheaders()}, cookies, resp.read().decode()
            )
        finally:
            conn.close()

    def login(self, token: str = TOKEN) -> str:
        """Log in through the form and return the ``name=value`` of the session cookie."""
        reply = self.request("POST", "/login", form={"token": token, "next": "/"})
        assert reply.status == 303, reply.body
        return reply.cookies[0].split(";", 1)[0]


@pytest.fixture
def serve_board(store: Store) -> Iterator[Callable[..., Board]]:
    """Start ``dashboard(store, **kwargs)`` on uvicorn at 127.0.0.1:<free port>; stopped after the test."""
    running: list[ThreadedUvicorn] = []

    def start(**kwargs: Any) -> Board:
        server = ThreadedUvicorn(dashboard(store, **kwargs), "127.0.0.1", 0)
        running.append(server)
        port = server.address[1]
        return Board(f"http://127.0.0.1:{port}", port)

    try:
        yield start
    finally:
        for server in running:
            server.close()


@pytest.fixture
def board(serve_board: Callable[..., Board]) -> Board:
    return serve_board(token=TOKEN, refresh_ms=500)


def _browser_missing() -> str | None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not (os.path.exists(p) or shutil.which(p))]
    if missing:
        return f"headless Chromium not installed ({', '.join(missing)} missing): apt-get install chromium chromium-driver"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed: make install"
    return None


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    """One headless Chromium for the session (Debian's chromium and chromium-driver, driven by Selenium).

    Missing, it fails the run in CI (CI set) and skips with the reason elsewhere.
    """
    reason = _browser_missing()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1440,900",
        "--force-device-scale-factor=1",
        "--no-first-run",
        "--disable-extensions",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser(chromium: Any) -> Iterator[Any]:
    """The session's browser with no cookies and a blank page at the start of each test."""
    # Cookies ignore the port: clear every host's, not only the current page's.
    chromium.execute_cdp_cmd("Network.clearBrowserCookies", {})
    chromium.get("about:blank")
    yield chromium
    chromium.get("about:blank")


def host_of(url: str) -> str:
    return urlsplit(url).netloc
