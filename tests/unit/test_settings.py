"""Operator settings: .env parsing, empty = unset, the token file, every problem at once (SPEC K2, K3)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from brooq_py.queue import ConfigError
from brooq_py.redact import mask_dsn
from brooq_py.settings import load_settings, parse_dotenv, parse_http_addr

DSN = "postgresql://app:s3cret-pw@db.example:5432/jobs"


def load(env: dict[str, str], tmp_path: Path, dotenv: str | None = None, **kw: object) -> object:
    path = tmp_path / ".env"
    if dotenv is not None:
        path.write_text(dotenv, encoding="utf-8")
    return load_settings(env, dotenv=path, **kw)  # type: ignore[arg-type]


def problems_of(env: dict[str, str], tmp_path: Path, dotenv: str | None = None, **kw: object) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(env, tmp_path, dotenv, **kw)
    return info.value.problems


# --- .env -------------------------------------------------------------------------------


def test_dotenv_parses_comments_quotes_and_export() -> None:
    text = "\n".join(
        [
            "# a comment",
            "",
            "PLAIN=value",
            "SPACED = spaced value   # trailing comment",
            "HASH=a#b",
            "export EXPORTED=yes",
            "SINGLE='literal \\n # kept'",
            'DOUBLE="line1\\nline2 \\"q\\""  # comment',
            "EMPTY=",
            "URL=postgresql://u:p@h/db?sslmode=disable",
        ]
    )
    values, problems = parse_dotenv(text)
    assert problems == []
    assert values == {
        "PLAIN": "value",
        "SPACED": "spaced value",
        "HASH": "a#b",
        "EXPORTED": "yes",
        "SINGLE": "literal \\n # kept",
        "DOUBLE": 'line1\nline2 "q"',
        "EMPTY": "",
        "URL": "postgresql://u:p@h/db?sslmode=disable",
    }


def test_dotenv_bad_lines_are_named_without_their_value() -> None:
    values, problems = parse_dotenv(
        "GOOD=1\nthis is not a setting secret-value\nQ='half-open-secret\n1BAD=x\n"
    )
    assert values == {"GOOD": "1"}
    assert len(problems) == 3
    assert "line 2" in problems[0] and "line 3" in problems[1] and "line 4" in problems[2]
    assert not any("secret-value" in p or "half-open-secret" in p for p in problems)


def test_environment_wins_over_dotenv(tmp_path: Path) -> None:
    settings = load(
        {"DATABASE_URL": DSN, "BROOQ_SCHEMA": "from_env"},
        tmp_path,
        "BROOQ_SCHEMA=from_file\nQUEUE_WORKERS=7\n",
    )
    assert settings.schema == "from_env"  # type: ignore[attr-defined]
    assert settings.config.workers == 7  # type: ignore[attr-defined]


def test_missing_dotenv_is_fine(tmp_path: Path) -> None:
    settings = load({"DATABASE_URL": DSN}, tmp_path)
    assert settings.schema == "public"  # type: ignore[attr-defined]
    assert (settings.http_host, settings.http_port) == ("127.0.0.1", 8090)  # type: ignore[attr-defined]
    assert settings.http_token is None  # type: ignore[attr-defined]


# --- empty = unset (SPEC K2) ------------------------------------------------------------


def test_empty_values_count_as_unset(tmp_path: Path) -> None:
    env = {
        "DATABASE_URL": DSN,
        "BROOQ_SCHEMA": "",
        "BROOQ_HTTP_ADDR": "",
        "BROOQ_HTTP_TOKEN": "",
        "BROOQ_HTTP_TOKEN_FILE": "",
        "QUEUE_LEASE": "",
        "QUEUE_WORKERS": "",
    }
    settings = load(env, tmp_path)
    assert settings.schema == "public"  # type: ignore[attr-defined]
    assert settings.http_port == 8090  # type: ignore[attr-defined]
    assert settings.http_token is None  # type: ignore[attr-defined]
    assert settings.config.lease == timedelta(seconds=120)  # type: ignore[attr-defined]


def test_empty_environment_value_does_not_hide_dotenv(tmp_path: Path) -> None:
    settings = load({"DATABASE_URL": DSN, "QUEUE_WORKERS": ""}, tmp_path, "QUEUE_WORKERS=3\n")
    assert settings.config.workers == 3  # type: ignore[attr-defined]


def test_schema_argument_wins_over_brooq_schema(tmp_path: Path) -> None:
    settings = load({"DATABASE_URL": DSN, "BROOQ_SCHEMA": "env_schema"}, tmp_path, schema="cli_schema")
    assert settings.schema == "cli_schema"  # type: ignore[attr-defined]


def test_missing_database_url_only_when_needed(tmp_path: Path) -> None:
    assert problems_of({}, tmp_path) == ["DATABASE_URL is not set"]
    assert load({}, tmp_path, need_database=False).database_url is None  # type: ignore[attr-defined]


# --- HTTP address --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:8090", ("127.0.0.1", 8090)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),
        ("localhost:9000", ("localhost", 9000)),
        ("[::1]:8091", ("::1", 8091)),
    ],
)
def test_http_addr_forms(text: str, expected: tuple[str, int]) -> None:
    assert parse_http_addr(text) == expected


@pytest.mark.parametrize(
    "text", ["8090", ":8090", "::1:8090", "[::1]8090", "host:99999", "host:80a", "host:"]
)
def test_http_addr_refused(text: str) -> None:
    with pytest.raises(ValueError, match="BROOQ_HTTP_ADDR"):
        parse_http_addr(text)


# --- token -----------------------------------------------------------------------------------


def test_token_file_strips_one_trailing_newline(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    env = {"DATABASE_URL": DSN, "BROOQ_HTTP_TOKEN_FILE": str(token_file)}
    token_file.write_bytes(b"abc123\n")
    assert load(env, tmp_path).http_token == "abc123"  # type: ignore[attr-defined]
    token_file.write_bytes(b"abc123\r\n")
    assert load(env, tmp_path).http_token == "abc123"  # type: ignore[attr-defined]
    token_file.write_bytes(b"abc123")
    assert load(env, tmp_path).http_token == "abc123"  # type: ignore[attr-defined]


def test_token_file_with_two_newlines_is_refused(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_bytes(b"abc123\n\n")
    problems = problems_of({"DATABASE_URL": DSN, "BROOQ_HTTP_TOKEN_FILE": str(token_file)}, tmp_path)
    assert problems == ["BROOQ_HTTP_TOKEN_FILE: the token must be printable ASCII without spaces"]


def test_token_file_relative_to_credentials_directory(tmp_path: Path) -> None:
    (tmp_path / "brooq-token").write_text("from-credentials\n")
    env = {
        "DATABASE_URL": DSN,
        "BROOQ_HTTP_TOKEN_FILE": "brooq-token",
        "CREDENTIALS_DIRECTORY": str(tmp_path),
    }
    assert load(env, tmp_path).http_token == "from-credentials"  # type: ignore[attr-defined]


def test_token_and_token_file_together_is_an_error(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("t2\n")
    env = {"DATABASE_URL": DSN, "BROOQ_HTTP_TOKEN": "t1-secret", "BROOQ_HTTP_TOKEN_FILE": str(token_file)}
    problems = problems_of(env, tmp_path)
    assert any("both set" in p for p in problems)
    assert not any("t1-secret" in p for p in problems)


def test_unreadable_token_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    problems = problems_of({"DATABASE_URL": DSN, "BROOQ_HTTP_TOKEN_FILE": str(missing)}, tmp_path)
    assert len(problems) == 1 and str(missing) in problems[0]


def test_settings_repr_hides_secrets(tmp_path: Path) -> None:
    settings = load({"DATABASE_URL": DSN, "BROOQ_HTTP_TOKEN": "tok-en-secret"}, tmp_path)
    assert settings.http_token == "tok-en-secret"  # type: ignore[attr-defined]
    text = repr(settings)
    assert "s3cret-pw" not in text and "tok-en-secret" not in text


# --- every problem at once (SPEC K2) ------------------------------------------------------------


def test_all_problems_listed_at_once(tmp_path: Path) -> None:
    env = {
        "QUEUE_LEASE": "120",  # a duration needs a unit
        "QUEUE_WORKERS": "four",
        "BROOQ_HTTP_ADDR": "nowhere",
        "BROOQ_LOG_LEVEL": "chatty",
        "BROOQ_HTTP_TOKEN": "has space",
    }
    problems = problems_of(env, tmp_path, "QUEUE_MAX_ATTEMPTS=1.5\nnot a line\n")
    joined = "\n".join(problems)
    for needle in (
        "DATABASE_URL",
        "QUEUE_LEASE",
        "QUEUE_WORKERS",
        "QUEUE_MAX_ATTEMPTS",
        "BROOQ_HTTP_ADDR",
        "BROOQ_LOG_LEVEL",
        "BROOQ_HTTP_TOKEN",
        "line 2",
    ):
        assert needle in joined, needle
    assert "has space" not in joined


def test_invalid_dsn_is_a_settings_problem_without_the_password(tmp_path: Path) -> None:
    problems = problems_of({"DATABASE_URL": "host=db password=hunter2 dangling"}, tmp_path)
    assert len(problems) == 1 and "DATABASE_URL" in problems[0]
    assert "hunter2" not in problems[0]


def test_overlong_schema_is_refused(tmp_path: Path) -> None:
    problems = problems_of({"DATABASE_URL": DSN}, tmp_path, schema="s" * 64)
    assert len(problems) == 1 and "63" in problems[0]


# --- mask_dsn (SPEC K3) ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dsn", "secret"),
    [
        ("postgresql://app:s3cret@db:5432/jobs", "s3cret"),
        ("postgres://app:p%40ss@db/jobs?sslmode=require", "p%40ss"),
        ("postgresql://app:we?ird@db/jobs", "we?ird"),
        ("postgresql://app@db/jobs?password=qsecret&sslmode=disable", "qsecret"),
        ("host=db user=app password=kvsecret dbname=jobs", "kvsecret"),
        ("host=db password = 'quoted secret' dbname=jobs", "quoted secret"),
    ],
)
def test_mask_dsn_hides_passwords(dsn: str, secret: str) -> None:
    masked = mask_dsn(dsn)
    assert secret not in masked
    assert "***" in masked


def test_mask_dsn_keeps_the_rest() -> None:
    assert mask_dsn("postgresql://app:pw@db:5432/jobs") == "postgresql://app:***@db:5432/jobs"
    assert mask_dsn("postgresql://app@db/jobs") == "postgresql://app@db/jobs"
    assert mask_dsn("host=db dbname=jobs") == "host=db dbname=jobs"


def test_k5_viewer_token_from_the_environment_or_a_file_hidden_in_repr(tmp_path: Path) -> None:
    env = {"DATABASE_URL": DSN, "BROOQ_HTTP_TOKEN": "op-secret", "BROOQ_HTTP_VIEWER_TOKEN": "view-secret"}
    settings = load(env, tmp_path)
    assert settings.http_viewer_token == "view-secret"  # type: ignore[attr-defined]
    assert "view-secret" not in repr(settings) and "op-secret" not in repr(settings)
    (tmp_path / "viewer").write_text("from-file\n")
    env = {"DATABASE_URL": DSN, "BROOQ_HTTP_VIEWER_TOKEN_FILE": str(tmp_path / "viewer")}
    assert load(env, tmp_path).http_viewer_token == "from-file"  # type: ignore[attr-defined]


def test_k5_viewer_token_problems_are_named(tmp_path: Path) -> None:
    same = {"DATABASE_URL": DSN, "BROOQ_HTTP_TOKEN": "same-one", "BROOQ_HTTP_VIEWER_TOKEN": "same-one"}
    assert any("must differ" in p and "same-one" not in p for p in problems_of(same, tmp_path))
    spaced = {"DATABASE_URL": DSN, "BROOQ_HTTP_VIEWER_TOKEN": "has space"}
    assert problems_of(spaced, tmp_path) == [
        "BROOQ_HTTP_VIEWER_TOKEN: the token must be printable ASCII without spaces"
    ]
    both = {"DATABASE_URL": DSN, "BROOQ_HTTP_VIEWER_TOKEN": "a", "BROOQ_HTTP_VIEWER_TOKEN_FILE": "b"}
    assert problems_of(both, tmp_path) == [
        "BROOQ_HTTP_VIEWER_TOKEN and BROOQ_HTTP_VIEWER_TOKEN_FILE are both set; set only one"
    ]
