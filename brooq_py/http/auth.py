"""The token both HTTP faces check: the surface's bearer header, the dashboard's header or cookie.

The token is compared in constant time (``hmac.compare_digest``) and never
echoed, logged or shown in a repr (SPEC O2, K3). The dashboard's session
cookie and its CSRF tokens are HMACs keyed by the token, so no server-side
session state exists and changing the token ends every session.
"""

from __future__ import annotations

import hashlib
import hmac
import time

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

    def new_session(self, now: float | None = None) -> str:
        """Return a session cookie value: its issue time and an HMAC of it."""
        issued = str(int(time.time() if now is None else now))
        return f"{issued}.{self._mac('session:' + issued)}"

    def session(self, value: str | None, now: float | None = None) -> bool:
        """Return whether *value* is a session cookie of this token younger than ``SESSION_SECONDS``."""
        if self._token is None or not value:
            return False
        issued, _, mac = value.partition(".")
        if not issued.isascii() or not issued.isdigit():
            return False
        if not hmac.compare_digest(mac.encode("ascii", "replace"), self._mac("session:" + issued).encode()):
            return False
        age = (time.time() if now is None else now) - int(issued)
        return 0 <= age < SESSION_SECONDS

    def csrf(self, session: str) -> str:
        """Return the CSRF token that forms of *session* must carry."""
        return self._mac("csrf:" + session)

    def csrf_ok(self, session: str, presented: str | None) -> bool:
        return bool(presented) and hmac.compare_digest(
            (presented or "").encode("ascii", "replace"), self.csrf(session).encode()
        )
