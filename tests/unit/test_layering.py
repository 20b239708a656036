"""Imports point one way: postgres -> queue <- engine (proved from the real imports, fresh interpreters)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, sys
before = set(sys.modules)
import {module}
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def loaded_by(module: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(module=module)], capture_output=True, text=True, check=True
    )
    mods: list[str] = json.loads(out.stdout)
    return mods


def top(name: str) -> str:
    return name.split(".")[0]


def test_queue_imports_only_the_standard_library() -> None:
    outside = sorted(
        {top(m) for m in loaded_by("brooq_py.queue")}
        - set(sys.stdlib_module_names)
        - {"brooq_py", "_distutils_hack"}
    )
    assert outside == []
    assert not [
        m for m in loaded_by("brooq_py.queue") if m.startswith(("brooq_py.engine", "brooq_py.postgres"))
    ]


@pytest.mark.parametrize(
    "forbidden", ["psycopg", "psycopg_pool", "sqlalchemy", "alembic", "brooq_py.postgres"]
)
def test_engine_never_imports_the_database_layer(forbidden: str) -> None:
    mods = loaded_by("brooq_py.engine")
    assert "brooq_py.engine" in mods
    assert not [m for m in mods if m == forbidden or m.startswith(forbidden + ".")]


def test_postgres_does_not_import_alembic_or_sqlalchemy() -> None:
    mods = loaded_by("brooq_py.postgres")
    assert "psycopg" in mods  # the probe works
    assert not [m for m in mods if top(m) in ("alembic", "sqlalchemy")]


@pytest.mark.parametrize(
    "forbidden", ["brooq_py.engine", "prometheus_client", "alembic", "sqlalchemy", "django"]
)
def test_a1_a_producer_only_import_stays_light(forbidden: str) -> None:
    """``import brooq_py.postgres`` (Store, AsyncStore, WrapTx, AsyncWrapTx) loads no engine, no
    metrics, no migration tool and no framework: the whole import graph, migrations included."""
    mods = loaded_by("brooq_py.postgres")
    assert "brooq_py.postgres.async_store" in mods  # the probe works
    assert not [m for m in mods if m == forbidden or m.startswith(forbidden + ".")]


def test_the_django_contrib_is_never_imported_by_the_core() -> None:
    for module in ("brooq_py", "brooq_py.postgres", "brooq_py.engine", "brooq_py.cli"):
        assert not [m for m in loaded_by(module) if m.startswith(("brooq_py.contrib", "django"))]
