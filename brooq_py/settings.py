"""Operator settings: the environment over a ``.env`` file, for the command line.

An empty value counts as unset, so ``KEY=`` never turns a default into an empty string. Every
problem is raised at once, before any connection, without a secret in its text (SPEC K3, K5).
"""

from __future__ import annotations

import os
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from brooq_py.engine.config import Config
from brooq_py.queue import ConfigError
from brooq_py.redact import MASK, mask_dsn

DEFAULT_SCHEMA = "public"
DEFAULT_HTTP_ADDR = "127.0.0.1:8090"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# PostgreSQL silently truncates longer identifiers, which would put jobs in another schema.
_MAX_IDENTIFIER_BYTES = 63
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TOKEN_CHARS = frozenset(string.ascii_letters + string.digits + string.punctuation)
# A double-quoted value up to its first unescaped quote, and one backslash escape in it.
_DOUBLE_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"', re.DOTALL)
_ESCAPE = re.compile(r"\\(.)", re.DOTALL)
_DOUBLE_QUOTE_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\", "$": "$"}


def parse_dotenv(text: str, *, source: str = ".env") -> tuple[dict[str, str], list[str]]:
    """Parse simple ``KEY=VALUE`` lines (``export``, ``#`` comments, quotes); return the values and
    the problems, each naming its line, never its value."""
    values: dict[str, str] = {}
    problems: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export ") or line.startswith("export\t"):
            line = line[len("export") :].lstrip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not _KEY.fullmatch(key):
            problems.append(f"{source} line {number}: expected KEY=VALUE")
            continue
        parsed = _parse_value(value.strip())
        if parsed is None:
            problems.append(f"{source} line {number}: unterminated or malformed quoted value for {key}")
            continue
        values[key] = parsed
    return values, problems


def _parse_value(value: str) -> str | None:
    if not value:
        return ""
    quote = value[0]
    if quote == "'":
        end = value.find("'", 1)
        if end < 0 or not _only_comment(value[end + 1 :]):
            return None
        return value[1:end]
    if quote == '"':
        match = _DOUBLE_QUOTED.match(value)
        if match is None or not _only_comment(value[match.end() :]):
            return None
        return _ESCAPE.sub(lambda e: _DOUBLE_QUOTE_ESCAPES.get(e[1], e[0]), match[1])
    comment = re.search(r"\s#", value)
    return (value[: comment.start()] if comment else value).rstrip()


def _only_comment(tail: str) -> bool:
    tail = tail.strip()
    return not tail or tail.startswith("#")


def check_dsn(dsn: str) -> str | None:
    """Return a problem if *dsn* is not a libpq connection string, else None; nothing connects."""
    if "\x00" in dsn:
        return "DATABASE_URL contains a NUL character"
    from psycopg import conninfo

    try:
        conninfo.conninfo_to_dict(dsn)
    except Exception:
        # libpq's message may quote the text around the error, the password included.
        return f"DATABASE_URL is not a valid connection string: {mask_dsn(dsn)}"
    return None


def merge_env(environ: Mapping[str, str], dotenv: Mapping[str, str]) -> dict[str, str]:
    """Return ``dotenv`` overlaid by ``environ``; an empty environment value does not override."""
    merged = {k: v for k, v in dotenv.items() if v != ""}
    merged.update({k: v for k, v in environ.items() if v != ""})
    return merged


@dataclass(frozen=True)
class Settings:
    """What the command line runs with. ``repr`` hides the DSN's password and the token."""

    database_url: str | None
    schema: str = DEFAULT_SCHEMA
    http_host: str = "127.0.0.1"
    http_port: int = 8090
    http_token: str | None = field(default=None, repr=False)
    log_level: str = "INFO"
    config: Config = field(default_factory=Config)
    http_viewer_token: str | None = field(default=None, repr=False)
    """BROOQ_HTTP_VIEWER_TOKEN: reads every page and GET endpoint, refused every action."""
    http_addr_set: bool = False
    """Whether BROOQ_HTTP_ADDR was set: a worker whose default address is taken picks another only if not."""

    def __repr__(self) -> str:
        dsn = None if self.database_url is None else mask_dsn(self.database_url)
        token = None if self.http_token is None else MASK
        viewer = None if self.http_viewer_token is None else MASK
        return (
            f"Settings(database_url={dsn!r}, schema={self.schema!r}, http_host={self.http_host!r}, "
            f"http_port={self.http_port}, http_token={token!r}, http_viewer_token={viewer!r}, "
            f"log_level={self.log_level!r}, config={self.config!r})"
        )

    @property
    def masked_database_url(self) -> str:
        return "(unset)" if self.database_url is None else mask_dsn(self.database_url)


def parse_http_addr(text: str) -> tuple[str, int]:
    """Parse ``host:port`` or ``[v6]:port`` (the host required, so listening everywhere is deliberate);
    raise ``ValueError`` naming the problem."""
    if text.startswith("["):
        close = text.find("]")
        if close < 0 or text[close + 1 : close + 2] != ":":
            raise ValueError(f"BROOQ_HTTP_ADDR={text!r}: expected [v6-address]:port")
        host, port_text = text[1:close], text[close + 2 :]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ValueError(f"BROOQ_HTTP_ADDR={text!r}: expected host:port")
        if ":" in host:
            raise ValueError(f"BROOQ_HTTP_ADDR={text!r}: put an IPv6 address in brackets, [::1]:8090")
    if not host:
        raise ValueError(
            f"BROOQ_HTTP_ADDR={text!r}: the host is missing (use 0.0.0.0:PORT to listen on every interface)"
        )
    if not port_text.isascii() or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"BROOQ_HTTP_ADDR={text!r}: the port must be a number from 0 to 65535")
    return host, int(port_text)


def _read_token_file(path_text: str, env: Mapping[str, str], problems: list[str], var: str) -> str | None:
    path = Path(path_text)
    credentials = env.get("CREDENTIALS_DIRECTORY")
    if not path.is_absolute() and credentials:
        # systemd LoadCredential=: a bare name refers to $CREDENTIALS_DIRECTORY/name.
        path = Path(credentials) / path
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        problems.append(f"{var}: cannot read {str(path)!r}: {exc.strerror or exc}")
        return None
    except UnicodeDecodeError:
        problems.append(f"{var}: {str(path)!r} is not UTF-8 text")
        return None
    return text[:-2] if text.endswith("\r\n") else text.removesuffix("\n")


def _check_token(token: str, var: str, problems: list[str]) -> str | None:
    if token == "":
        problems.append(f"{var}: the token is empty")
        return None
    if not all(ch in _TOKEN_CHARS for ch in token):
        problems.append(f"{var}: the token must be printable ASCII without spaces")
        return None
    return token


def _token(env: Mapping[str, str], var: str, problems: list[str]) -> str | None:
    """The token in *var*, or in the file *var*_FILE names (one of them, not both)."""
    inline, token_file = env.get(var), env.get(f"{var}_FILE")
    if inline is not None and token_file is not None:
        problems.append(f"{var} and {var}_FILE are both set; set only one")
    elif inline is not None:
        return _check_token(inline, var, problems)
    elif token_file is not None:
        read = _read_token_file(token_file, env, problems, f"{var}_FILE")
        if read is not None:
            return _check_token(read, f"{var}_FILE", problems)
    return None


def load_settings(
    environ: Mapping[str, str] | None = None,
    *,
    dotenv: str | Path | None = ".env",
    schema: str | None = None,
    need_database: bool = True,
) -> Settings:
    """Read the settings from *environ* (default ``os.environ``) and the *dotenv* file if it exists.

    *schema* (``--schema``) wins over ``BROOQ_SCHEMA``. Raise ``ConfigError`` listing every problem,
    a missing ``DATABASE_URL`` among them with *need_database*; nothing connects here.
    """
    problems: list[str] = []
    file_values: dict[str, str] = {}
    if dotenv is not None:
        path = Path(dotenv)
        if path.is_file():
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                problems.append(f"{path}: cannot read: {exc}")
            else:
                file_values, file_problems = parse_dotenv(text, source=str(path))
                problems.extend(file_problems)
    env = merge_env(os.environ if environ is None else environ, file_values)

    database_url = env.get("DATABASE_URL")
    if database_url is None and need_database:
        problems.append("DATABASE_URL is not set")
    elif database_url is not None:
        problem = check_dsn(database_url)
        if problem:
            problems.append(problem)

    schema_name = schema if schema else env.get("BROOQ_SCHEMA", DEFAULT_SCHEMA)
    if "\x00" in schema_name:
        problems.append("schema name contains a NUL character")
    elif len(schema_name.encode("utf-8", "surrogatepass")) > _MAX_IDENTIFIER_BYTES:
        problems.append(f"schema name {schema_name!r} is longer than {_MAX_IDENTIFIER_BYTES} bytes")

    host, port = "127.0.0.1", 8090
    try:
        host, port = parse_http_addr(env.get("BROOQ_HTTP_ADDR", DEFAULT_HTTP_ADDR))
    except ValueError as exc:
        problems.append(str(exc))

    token = _token(env, "BROOQ_HTTP_TOKEN", problems)
    viewer_token = _token(env, "BROOQ_HTTP_VIEWER_TOKEN", problems)
    if token is not None and token == viewer_token:
        problems.append(
            "BROOQ_HTTP_VIEWER_TOKEN: must differ from BROOQ_HTTP_TOKEN (the viewer may only read)"
        )

    log_level = env.get("BROOQ_LOG_LEVEL", "INFO").upper()
    if log_level not in LOG_LEVELS:
        problems.append(f"BROOQ_LOG_LEVEL={log_level!r}: expected one of {', '.join(LOG_LEVELS)}")

    config: Config | None = None
    try:
        config = Config.from_env(env)
    except ConfigError as exc:
        problems.extend(exc.problems)

    if problems or config is None:
        raise ConfigError(problems)
    return Settings(
        database_url=database_url,
        schema=schema_name,
        http_host=host,
        http_port=port,
        http_token=token,
        http_viewer_token=viewer_token,
        log_level=log_level,
        config=config,
        http_addr_set="BROOQ_HTTP_ADDR" in env,
    )
