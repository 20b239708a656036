"""The dashboard: one Starlette application, Jinja2 templates and its own static files (no CDN; SPEC U3).

Tokens are ``auth``'s and actions ``actions.Operator``'s, so it behaves as the surface does.
Actions are POST forms with a CSRF token bound to the session; a bearer header needs none,
since a foreign page cannot set one.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import secrets
from collections.abc import Callable
from importlib import resources
from typing import Any
from urllib.parse import urlencode

import psycopg_pool
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from brooq_py.http.actions import ActionError, Operator
from brooq_py.http.api import Gate, Gated, check_body
from brooq_py.http.auth import SESSION_SECONDS, Role, Roles, is_loopback, loopback_name
from brooq_py.http.render import jinja_env, job_view, tenants_path
from brooq_py.postgres.async_store import AsyncStore
from brooq_py.postgres.flow.limits import TENANT_COUNT_CAP, TENANT_SCAN
from brooq_py.postgres.operator.overview import (
    FINISHED,
    SEARCH_SCAN,
    STATES,
    WAITING,
    BadCursor,
    JobsPage,
    Overview,
)
from brooq_py.postgres.store import Store
from brooq_py.queue import ACTIVE_STATES, InvalidJob, State
from brooq_py.queue.job import MAX_TOPIC_BYTES, check_length, check_text

log = logging.getLogger("brooq_py.web")

COOKIE = "brooq_session"
PAGE_SIZE = 50
TENANTS_SHOWN = 100  # tenants on a topic's tenants page, the busiest first
MAX_FILTER = 2000  # characters of a payload filter
MAX_MESSAGE = 4000  # characters of an action's message, carried in the redirect's query
RETRYABLE = (State.DEAD, State.CANCELED)
CANCELABLE = (*ACTIVE_STATES, State.SCHEDULED)


class Refused(Exception):
    """A request answered before its endpoint's work: *response* (a redirect to the login) says why."""

    def __init__(self, response: Response) -> None:
        super().__init__("refused")
        self.response = response


class Dashboard:
    """The dashboard's endpoints over one Operator; ``app`` is the ASGI application. Raise
    ``ValueError`` when *token* and *viewer_token* are equal."""

    def __init__(
        self,
        operator: Operator,
        overview: Overview,
        *,
        token: str | None,
        read_only: bool,
        refresh_ms: int = 2000,
        viewer_token: str | None = None,
    ) -> None:
        self.op = operator
        self.overview = overview
        self.roles = Roles(token, viewer_token)
        self.login = self.roles.configured
        if not self.login:  # loopback only: a random key signs the sessions the forms' CSRF tokens need
            self.roles = Roles(secrets.token_urlsafe(32))
        self.read_only = read_only
        self.refresh_ms = refresh_ms
        self.templates = Jinja2Templates(env=jinja_env())
        static = resources.files("brooq_py.http") / "static"
        routes = [
            Route("/", self.topics_page, name="topics"),
            Route("/topics.rows", self.topics_rows, name="topics_rows"),
            Route("/jobs", self.jobs_page, name="jobs"),
            Route("/jobs/{job_id}", self.job_page, name="job"),
            Route("/job/{job_id}", self.old_job_page, name="old_job"),
            Route("/dead", self.dead_page, name="dead"),
            Route("/topics/{topic:path}/tenants", self.tenants_page, name="tenants"),
            Route("/login", self.login_page, methods=["GET", "POST"], name="login"),
            Route("/logout", self.logout, methods=["POST"], name="logout"),
            Route("/action/{action}", self.action, methods=["POST"], name="action"),
            Mount("/static", app=StaticFiles(directory=str(static)), name="static"),
        ]
        # What an endpoint raises to refuse answers the request: an error page, or Refused's redirect.
        self.app = Starlette(
            routes=routes, exception_handlers={ActionError: self._refused, Refused: self._refused}
        )

    def _session(self, request: Request) -> Role | None:
        return self.roles.session(request.cookies.get(COOKIE))

    def _bearer(self, request: Request) -> Role | None:
        if not self.login:
            return None
        return self.roles.bearer(request.headers.get("authorization"))

    def _role(self, request: Request) -> Role | None:
        """The role *request* authenticated as (after ``guard``: loopback without a token is the operator)."""
        if not self.login:
            return "operator"
        return self._bearer(request) or self._session(request)

    def _may_act(self, request: Request) -> bool:
        return not self.read_only and self._role(request) == "operator"

    def _set_session(self, response: Response, request: Request, value: str) -> None:
        response.set_cookie(
            COOKIE,
            value,
            max_age=SESSION_SECONDS,
            path=request.scope.get("root_path") or "/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )

    def guard(self, request: Request) -> None:
        """Raise the refusal of *request* unless it may see the dashboard."""
        if not self.login:
            server = request.scope.get("server")
            if not is_loopback(server[0] if server else None) or not loopback_name(
                request.headers.get("host")
            ):
                raise ActionError(
                    403, "This dashboard has no token: serve it on a loopback address or give it a token."
                )
        elif self._role(request) is None:
            if request.method not in ("GET", "HEAD"):
                raise ActionError(401, "Log in first.")
            target = self._url(
                request, "/login", next=request.url.path[len(request.scope.get("root_path", "")) :] or "/"
            )
            raise Refused(RedirectResponse(target, status_code=303))

    def _check_csrf(self, request: Request, form: Any) -> None:
        if self._bearer(request):
            return  # a header a foreign page cannot set
        session = request.cookies.get(COOKIE)
        role = self.roles.session(session)
        if session is None or role is None:
            raise ActionError(403, "Your session has expired: reload the page.")
        if not self.roles.guard(role).csrf_ok(session, form.get("csrf")):
            raise ActionError(403, "The form's CSRF token is missing or wrong: reload the page.")

    def _url(self, request: Request, path: str, **query: Any) -> str:
        base = str(request.scope.get("root_path", ""))
        params = {k: v for k, v in query.items() if v is not None}
        return base + path + ("?" + urlencode(params) if params else "")

    def _page(self, request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
        roles = self.roles
        session = request.cookies.get(COOKIE)
        role = roles.session(session)
        valid = session if role is not None else None
        fresh = None
        if valid is None and not self.login and status < 400:  # never to a refused request
            role, fresh = "operator", roles.operator.new_session()
            valid = fresh
        base = str(request.scope.get("root_path", ""))
        context = {
            "title": "brooq",
            "base": base,
            "url": lambda path, **q: self._url(request, path, **q),
            "csrf": roles.guard(role).csrf(valid) if valid and role else "",
            # A viewer (or a read-only dashboard) is shown no action, and refused any (action()).
            "read_only": not self._may_act(request),
            # The badge tells a signed-in reader why no button shows; before the login it says nothing.
            "signed_in": self._role(request) is not None,
            "login": self.login,
            "states": [str(s) for s in STATES],
            "refresh_ms": self.refresh_ms,
            "here": _here(request, base),
            **context,
        }
        response = self.templates.TemplateResponse(request, name, context, status_code=status)
        response.headers["Cache-Control"] = "no-store"
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Referrer-Policy"] = "same-origin"
        response.headers["Content-Security-Policy"] = (
            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
            "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
        )
        if fresh is not None:
            self._set_session(response, request, fresh)
        return response

    def _error(self, request: Request, status: int, message: str) -> Response:
        return self._page(
            request, "error.html", {"status": status, "message": message, "title": str(status)}, status
        )

    def _refused(self, request: Request, exc: Exception) -> Response:
        if isinstance(exc, Refused):
            return exc.response
        assert isinstance(exc, ActionError)
        return self._error(request, exc.status, exc.message)

    def topics_page(self, request: Request) -> Response:
        self.guard(request)
        return self._topics(request, "topics.html")

    def topics_rows(self, request: Request) -> Response:
        """The topics table's rows alone: what the live refresh swaps in. Their forms come back to
        the topics page, not to this fragment."""
        self.guard(request)
        return self._topics(request, "_topics_rows.html", here="/")

    def _topics(self, request: Request, template: str, **context: Any) -> Response:
        return self._page(request, template, {"overview": self.op.topics(), "title": "Topics", **context})

    def jobs_page(self, request: Request) -> Response:
        self.guard(request)
        topic = request.query_params.get("topic") or None
        state = request.query_params.get("state", "")
        if state not in {str(s) for s in STATES} or (topic is None and state not in FINISHED):
            return self._error(request, 400, "Unknown state, or a state that needs a topic.")
        if topic is not None and not _possible_topic(topic):
            return self._error(request, 400, "No job can have that topic.")
        return self._listing(request, "jobs.html", topic, state)

    def dead_page(self, request: Request) -> Response:
        self.guard(request)
        return self._listing(request, "jobs.html", None, State.DEAD)

    def _listing(self, request: Request, template: str, topic: str | None, state: str) -> Response:
        after = request.query_params.get("after")
        raw_filter = (request.query_params.get("payload") or "").strip()
        search, page, filter_error = None, JobsPage([], None), None
        try:
            if raw_filter:
                search = self.op.guarded(
                    "searching payloads",
                    self.overview.search,
                    topic,
                    state,
                    payload_filter(raw_filter),
                    after,
                    SEARCH_SCAN,
                    PAGE_SIZE,
                )
                page = JobsPage(search.jobs, search.next)
            else:
                page = self.op.guarded(
                    "reading a page of jobs", self.overview.jobs, topic, state, after, PAGE_SIZE
                )
        except BadFilter as exc:
            filter_error = str(exc)
        except BadCursor:
            return self._error(request, 400, "That page link is not valid.")
        context = {
            "topic": topic,
            "state": state,
            "page": page,
            "after": after,
            "payload_filter": raw_filter,
            "search": search,
            "search_scan": SEARCH_SCAN,
            "filter_error": filter_error,
            "retryable": state in RETRYABLE,
            "cancelable": state in CANCELABLE,
            "waiting": state in WAITING,
            "title": f"{topic or 'All topics'} · {state}",
        }
        return self._page(request, template, context, 400 if filter_error else 200)

    def tenants_page(self, request: Request) -> Response:
        """A topic's busiest tenants, with the forms that set their limits, rates and weights (SPEC T1-T3)."""
        self.guard(request)
        topic = request.path_params["topic"]
        if not _possible_topic(topic):
            return self._error(request, 400, "No job can have that topic.")
        context = {
            "topic": topic,
            "page": self.op.tenant_page(topic, TENANTS_SHOWN),
            "cap": TENANT_COUNT_CAP,
            "scan": TENANT_SCAN,
            "here": tenants_path(topic),
            "title": f"{topic} · tenants",
        }
        return self._page(request, "tenants.html", context)

    def job_page(self, request: Request) -> Response:
        self.guard(request)
        view = job_view(self.op, self.overview, request.path_params["job_id"])
        state = view["job"].state
        context = {**view, "retryable": state in RETRYABLE, "cancelable": state in CANCELABLE}
        return self._page(request, "job.html", context)

    def old_job_page(self, request: Request) -> Response:
        """The job page's former address: a permanent redirect to /jobs/<id> (the API's address too)."""
        query = request.url.query
        target = self._url(request, f"/jobs/{request.path_params['job_id']}") + (f"?{query}" if query else "")
        return RedirectResponse(target, status_code=308)

    async def login_page(self, request: Request) -> Response:
        if not self.login:
            return RedirectResponse(self._url(request, "/"), status_code=303)
        target = _local(request.query_params.get("next"))
        if request.method == "POST":
            form = await self._form(request)
            target = _local(str(form.get("next") or ""))
            role = self.roles.matches(str(form.get("token") or ""))
            if role is not None:
                response = RedirectResponse(self._url(request, target), status_code=303)
                self._set_session(response, request, self.roles.guard(role).new_session())
                return response
            log.info("dashboard login refused")
            return self._page(request, "login.html", {"next": target, "failed": True, "title": "Log in"}, 401)
        return self._page(request, "login.html", {"next": target, "failed": False, "title": "Log in"})

    async def logout(self, request: Request) -> Response:
        await self._posted(request)
        response = RedirectResponse(self._url(request, "/login" if self.login else "/"), status_code=303)
        response.delete_cookie(COOKIE, path=request.scope.get("root_path") or "/")
        return response

    async def _form(self, request: Request) -> FormData:
        """Read a small urlencoded form: never more than ``MAX_BODY`` bytes, never a chunked body."""
        problem = check_body(request.headers.get("content-length"), request.headers.get("transfer-encoding"))
        if problem is not None:
            raise ActionError(problem.status, "That form is too large or malformed.")
        return await request.form(max_files=0, max_fields=2 * PAGE_SIZE + 10)

    async def _posted(self, request: Request) -> FormData:
        """The form of a state-changing POST: token first, then a bounded body, then its CSRF token."""
        self.guard(request)
        form = await self._form(request)
        self._check_csrf(request, form)
        return form

    async def action(self, request: Request) -> Response:
        form = await self._posted(request)
        if self.read_only:
            return self._error(request, 403, "This dashboard is read-only.")
        if self._role(request) != "operator":
            return self._error(
                request, 403, "Your token may read, not act: log in with the operator's token."
            )
        name = request.path_params["action"]
        act = _ACTIONS.get(name)
        if act is None:
            return self._error(request, 404, "No such action.")
        values = {
            k: [str(v) for v in form.getlist(k)]
            for k in ("id", "topic", "value", "sequence", "tenant", "what")
        }
        message = await run_in_threadpool(act, self.op, values)
        back = _local(str(form.get("back") or "/"))
        sep = "&" if "?" in back else "?"
        return RedirectResponse(
            self._url(request, back) + sep + urlencode({"done": message}), status_code=303
        )


class BadFilter(ValueError):
    """A payload filter that is not JSON (its message is shown on the page)."""


def payload_filter(raw: str) -> Any:
    """Return the JSON value *raw* (the search box: ``{"user_id": 7}``), or raise BadFilter saying why."""
    if len(raw) > MAX_FILTER:
        raise BadFilter(f"The payload filter is longer than {MAX_FILTER:,} characters.")

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        value = json.loads(raw, parse_constant=no_constant)
    except ValueError as exc:
        raise BadFilter(
            f"The payload filter is not valid JSON ({exc}). Write a JSON value the payloads contain, "
            'for example {"user_id": 7}.'
        ) from None
    if "\\u0000" in json.dumps(value):
        raise BadFilter("The payload filter holds a NUL character (\\u0000), which no payload can hold.")
    return value


def _one(values: dict[str, list[str]], key: str) -> str:
    got = values.get(key) or []
    if len(got) != 1:
        raise ActionError(400, f"expected one {key}")
    return got[0]


def _retry_many(op: Operator, values: dict[str, list[str]]) -> str:
    ids = values.get("id") or []
    if not ids or len(ids) > PAGE_SIZE:
        raise ActionError(400, f"expected 1 to {PAGE_SIZE} job ids")
    refused = [i for i in ids if not op.retry(i)]
    message = f"{len(ids) - len(refused)} of {len(ids)} jobs retried"
    if not refused:
        return message
    # Why each was refused, while the message stays short enough for the redirect's URL.
    reasons: list[str] = []
    for n, i in enumerate(refused):
        reason = (
            f"{i}: {op.retry_refusal(i) or 'not retryable'}"  # whole: UUIDv7s made together share a prefix
        )
        if sum(len(r) + 2 for r in reasons) + len(reason) > MAX_MESSAGE:
            reasons.append(f"and {len(refused) - n} more (open each to retry it alone and see why)")
            break
        reasons.append(reason)
    return f"{message}; not retried: " + "; ".join(reasons)


def _sequence_resume(op: Operator, values: dict[str, list[str]]) -> str:
    if op.resume_sequence(_one(values, "topic"), _one(values, "sequence")):
        return "Sequence resumed"
    return "Sequence was not halted"


def _pause(op: Operator, values: dict[str, list[str]], paused: bool = True) -> str:
    op.set_paused(_one(values, "topic"), paused)
    return "Topic paused" if paused else "Topic resumed"


def _retry(op: Operator, values: dict[str, list[str]]) -> str:
    job = _one(values, "id")
    if op.retry(job):
        return "Job retried"
    return f"Job was not retried: {op.retry_refusal(job) or 'not retryable'}"


def _rate(op: Operator, values: dict[str, list[str]]) -> str:
    limit, _ = op.set_rate(_one(values, "topic"), _one(values, "value").strip() or "none")
    return "Rate limit removed" if limit is None else "Rate limit set"


def _depth(op: Operator, values: dict[str, list[str]]) -> str:
    depth = op.set_depth(_one(values, "topic"), _one(values, "value").strip() or "none")
    return "Depth cap removed" if depth is None else "Depth cap set"


def _tenant(op: Operator, values: dict[str, list[str]]) -> str:
    """Set a tenant's own limit, rate or weight (``what``; the ``tenant`` field names it), or,
    without a tenant field, the limit or rate every tenant of the topic has by default."""
    what = _one(values, "what")
    label = {"limit": "Limit", "rate": "Rate limit", "weight": "Weight"}.get(what)
    if label is None:
        raise ActionError(400, "expected what=limit, rate or weight")
    tenant = _one(values, "tenant") if values.get("tenant") else None
    if tenant is None and what == "weight":
        raise ActionError(400, "expected one tenant: a weight is a named tenant's own")
    value = op.set_tenant(_one(values, "topic"), tenant, what, _one(values, "value").strip() or "none")
    removed = next(iter(value.values())) is None
    whose = "every tenant's default" if tenant is None else f"tenant {tenant!r}"
    return f"{label} of {whose} " + ("removed" if removed else "set")


_ACTIONS: dict[str, Callable[[Operator, dict[str, list[str]]], str]] = {
    "cancel": lambda op, v: "Job canceled" if op.cancel(_one(v, "id")) else "Job was not cancelable",
    "retry": _retry,
    "rate": _rate,
    "depth": _depth,
    "retry-many": _retry_many,
    "pause": _pause,
    "resume": functools.partial(_pause, paused=False),
    "sequence-resume": _sequence_resume,
    "tenant": _tenant,
}


def _here(request: Request, base: str) -> str:
    """Return the current page inside the dashboard, without the last action's message."""
    query = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "done"])
    return request.url.path[len(base) :] + ("?" + query if query else "")


def _possible_topic(topic: str) -> bool:
    """False for a topic no job can have (a NUL, broken Unicode, too long): PostgreSQL refuses a NUL in text."""
    try:
        check_text(topic, "topic")
        check_length(topic, MAX_TOPIC_BYTES, "topic")
    except InvalidJob:
        return False
    return True


def _local(target: str | None) -> str:
    """Return *target* when it is a path inside the dashboard, else ``/`` (no open redirect)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


# The sync pool a dashboard of an AsyncStore opens for itself: pages are few and short.
OWN_POOL_MAX = 4


def dashboard(
    store: Store | AsyncStore,
    *,
    token: str | None = None,
    read_only: bool = False,
    concurrency: int = 32,
    refresh_ms: int = 2000,
    cache_seconds: float = 2.0,
    viewer_token: str | None = None,
) -> ASGIApp:
    """Return the dashboard of *store* as an ASGI application.

    Every page and action needs *token* (a login form sets a session cookie; ``Authorization:
    Bearer <token>`` works too). *viewer_token* reads every page and is refused every action
    (403). Without either token it answers only requests received on a loopback address (403
    otherwise). *read_only* hides and refuses every action, whatever the token. Raise
    ``ValueError`` when both tokens are the same. Beyond *concurrency* requests at once the
    answer is 503. Topic counts are read at most every *cache_seconds* (shared by every viewer);
    pages refresh them every *refresh_ms* milliseconds.

    Given an ``AsyncStore``, it opens a sync pool of its own (at most 4 connections, none while
    idle) with the same settings and schema, closed at the lifespan's shutdown, else at exit.
    """
    close: Callable[[], None] | None = None
    if isinstance(store, AsyncStore):
        store, close = _sync_twin(store)
    if not isinstance(store, Store):
        raise TypeError(
            f"dashboard() needs a brooq_py.postgres.Store or AsyncStore, got {type(store).__name__}"
        )
    overview = Overview(store, ttl=cache_seconds)
    board = Dashboard(
        Operator(store, store, overview),
        overview,
        token=token,
        read_only=read_only,
        refresh_ms=refresh_ms,
        viewer_token=viewer_token,
    )
    app: ASGIApp = Gated(board.app, Gate(concurrency))
    return app if close is None else ClosesAtShutdown(app, close)


def _sync_twin(store: AsyncStore) -> tuple[Store, Callable[[], None]]:
    """A Store on a sync pool of the AsyncStore's settings, and how to close that pool."""
    apool: Any = store.session.pool
    if apool is None:
        raise TypeError("dashboard() needs an AsyncStore with a pool (AsyncStore(pool, schema=...))")
    conninfo = apool.conninfo
    if inspect.iscoroutinefunction(conninfo) or inspect.iscoroutinefunction(apool.kwargs):
        raise TypeError(
            "dashboard() cannot use an AsyncStore whose pool computes its settings with async code"
        )
    pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
        conninfo, kwargs=apool.kwargs, min_size=0, max_size=OWN_POOL_MAX, open=True, name="brooq-dashboard"
    )
    return Store(pool, schema=store.schema), pool.close


class ClosesAtShutdown:
    """Pass everything to *app*; at the lifespan's shutdown, call *close* (off the event loop) first."""

    def __init__(self, app: ASGIApp, close: Callable[[], None]) -> None:
        self.app = app
        self.close = close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def receiving() -> Message:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                await run_in_threadpool(self.close)
            return message

        await self.app(scope, receiving if scope["type"] == "lifespan" else receive, send)
