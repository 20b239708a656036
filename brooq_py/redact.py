"""Keep secrets out of logs, errors and /metrics (SPEC K3): one masking rule, standard library only."""

from __future__ import annotations

import re

MASK = "***"

_URL_START = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#\s]*", re.IGNORECASE)
_KV_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S*)", re.IGNORECASE)
# user:password@ inside a URL found anywhere in free text (an error message, a log line)
_URL_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)[^\s@]*@")


def mask_dsn(dsn: str) -> str:
    """Return *dsn* with any password replaced by ``***``; never fails, even on text that does not parse."""
    match = _URL_START.match(dsn)
    if match is None:
        return _KV_PASSWORD.sub(lambda m: m.group(1) + MASK, dsn)
    head, rest = dsn[: match.end()], dsn[match.end() :]
    query_at = rest.find("?")
    authority = rest if query_at < 0 else rest[:query_at]
    at = authority.rfind("@")
    if at < 0:
        # A password holding an unescaped '?' would end the search early; fall back to the first '@'.
        at = rest.find("@")
    if at >= 0:
        userinfo = rest[:at]
        colon = userinfo.find(":")
        if colon >= 0:
            rest = userinfo[: colon + 1] + MASK + rest[at:]
    return head + _QUERY_PASSWORD.sub(lambda m: m.group(1) + MASK, rest)


def mask_secrets(text: str) -> str:
    """Mask every DSN password found anywhere in free *text* (both DSN forms)."""
    text = _URL_USERINFO.sub(lambda m: m.group(1) + MASK + "@", text)
    text = _QUERY_PASSWORD.sub(lambda m: m.group(1) + MASK, text)
    return _KV_PASSWORD.sub(lambda m: m.group(1) + MASK, text)
