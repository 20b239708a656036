"""The tokens both HTTP faces check: the operator's reads and acts, the viewer's only reads (SPEC K5).

Tokens are compared in constant time against both roles, and never echoed, logged or shown in a
repr (SPEC O2, K3). Session cookies and CSRF tokens are HMACs keyed by the token that logged in:
no session state on the server, the key tells the role, and a changed token ends its sessions.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import time
from typing import Literal

SESSION_SECONDS = 12 * 3600


class TokenGuard:
    """One configured token (None or empty: nothing is accepted, and callers turn the feature off)."""

    def __init__(self, token: str | None) -> None:
        # An empty token is no token: otherwise "Authorization: Bearer " would open the door.
        self._token = token.encode("utf-8") if token else None

    @property
    def configured(self) -> bool:
        return self._token is not None

    def __repr__(self) -> str:
        return f"TokenGuard({'set' if self._token else 'unset'})"

    def matches(self, presented: str) -> bool:
        """Return whether *presented* is the token, compared in constant time."""
        if self._token is None:
            return False
        return hmac.compare_digest(presented.encode("utf-8", "surrogateescape"), self._token)

    def bearer(self, authorization: str | None) -> bool:
        """Return whether an ``Authorization`` header value carries the token as a bearer."""
        scheme, _, given = (authorization or "").strip().partition(" ")
        # Compare even when the scheme is wrong, so every refusal takes the same path.
        same = self.matches(given.strip())
        return same and scheme.lower() == "bearer"

    def _mac(self, message: str) -> str:
        assert self._token is not None
        return hmac.new(self._token, message.encode("utf-8"), hashlib.sha256).hexdigest()

    def new_session(self) -> str:
        """Return a session cookie value: its issue time and an HMAC of it."""
        issued = str(int(time.time()))
        return f"{issued}.{self._mac('session:' + issued)}"

    def session(self, value: str | None) -> bool:
        """Return whether *value* is a session cookie of this token younger than ``SESSION_SECONDS``."""
        if self._token is None or not value:
            return False
        issued, _, mac = value.partition(".")
        if not issued.isascii() or not issued.isdigit():
            return False
        if not hmac.compare_digest(mac.encode("ascii", "replace"), self._mac("session:" + issued).encode()):
            return False
        age = time.time() - int(issued)
        return 0 <= age < SESSION_SECONDS

    def csrf(self, session: str) -> str:
        """Return the CSRF token that forms of *session* must carry."""
        return self._mac("csrf:" + session)

    def csrf_ok(self, session: str, presented: str | None) -> bool:
        return bool(presented) and hmac.compare_digest(
            (presented or "").encode("ascii", "replace"), self.csrf(session).encode()
        )


Role = Literal["operator", "viewer"]


class Roles:
    """The operator's token and the viewer's (None: no such role); equal ones raise ``ValueError``."""

    def __init__(self, token: str | None, viewer_token: str | None = None) -> None:
        if token and viewer_token and hmac.compare_digest(token.encode(), viewer_token.encode()):
            raise ValueError("the viewer token must differ from the operator token")
        self.operator = TokenGuard(token)
        self.viewer = TokenGuard(viewer_token)

    @property
    def configured(self) -> bool:
        """Whether any token is set (without one, callers turn the feature off)."""
        return self.operator.configured or self.viewer.configured

    def __repr__(self) -> str:
        return f"Roles(operator={self.operator!r}, viewer={self.viewer!r})"

    def bearer(self, authorization: str | None) -> Role | None:
        """Return the role whose token an ``Authorization`` header carries, or None."""
        # Both compared every time, so the answer's timing tells nothing of which one matched.
        operator, viewer = self.operator.bearer(authorization), self.viewer.bearer(authorization)
        return "operator" if operator else "viewer" if viewer else None

    def matches(self, presented: str) -> Role | None:
        """Return the role whose token *presented* is (the dashboard's login form), or None."""
        operator, viewer = self.operator.matches(presented), self.viewer.matches(presented)
        return "operator" if operator else "viewer" if viewer else None

    def guard(self, role: Role) -> TokenGuard:
        return self.operator if role == "operator" else self.viewer

    def session(self, value: str | None) -> Role | None:
        """Return the role of a valid session cookie *value* (by the key that signed it), or None."""
        operator, viewer = self.operator.session(value), self.viewer.session(value)
        return "operator" if operator else "viewer" if viewer else None


def is_loopback(host: str | None) -> bool:
    """Return whether *host* (an address or ``localhost``) is a loopback address."""
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def loopback_name(host: str | None) -> bool:
    """Return whether a Host header (None: HTTP/1.0) names a loopback address: a page rebound to
    127.0.0.1 (DNS rebinding) would otherwise read a tokenless dashboard and its CSRF token."""
    if host is None:
        return True
    name = host.strip().lower()
    if name.startswith("["):
        name = name[1:].partition("]")[0]
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    return is_loopback(name.rstrip("."))
