"""SPEC K3: one masking rule for DSN passwords, in a DSN and anywhere in free text."""

from __future__ import annotations

import pytest

from brooq_py.redact import mask_dsn, mask_secrets


@pytest.mark.parametrize(
    ("dsn", "secret"),
    [
        ("postgresql://app:we?ird@db/jobs", "we?ird"),
        ("postgresql://app:s3/cret@db/jobs", "s3/cret"),
        ("postgresql://app:p@ss@db:5432/jobs?sslmode=require", "p@ss"),
        ("postgresql://app@db/jobs?sslmode=require&password=s3cret", "s3cret"),
        ("host=db user=app password='s3 cret' dbname=jobs", "s3 cret"),
        ("host=db password=s3cret", "s3cret"),
    ],
)
def test_k3_password_never_survives_masking(dsn: str, secret: str) -> None:
    assert secret not in mask_dsn(dsn)
    assert secret not in mask_secrets(f"connection to {dsn} failed: timeout")


def test_k3_masking_keeps_what_is_not_secret() -> None:
    assert mask_dsn("postgresql://app:pw@db:5432/jobs") == "postgresql://app:***@db:5432/jobs"
    assert mask_dsn("postgresql://root@127.0.0.1:5432/test") == "postgresql://root@127.0.0.1:5432/test"
    assert mask_secrets("no secret here") == "no secret here"
