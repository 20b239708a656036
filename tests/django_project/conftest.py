"""The Django 6 test project: one migrated schema for the session, Django set up on it.

Django 6 needs Python >= 3.12 while brooq_py supports 3.11: these tests run in
a venv of their own (``make test-django``, part of ``make test``). Where Django
is not installed, this directory is not collected.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

if importlib.util.find_spec("django") is None:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def django_env(dsn: str) -> Iterator[dict[str, str]]:
    """Set Django up on a fresh schema, migrated by ``manage.py migrate`` (brooq's tables come from
    the app's migration), with the Order table; yield the environment a ``manage.py`` subprocess needs."""
    import django
    import psycopg
    from django.core.management import call_command
    from django.db import connection
    from psycopg import sql

    from tests.conftest import drop_schema

    schema = "dj_" + uuid.uuid4().hex
    with psycopg.connect(dsn, autocommit=True) as conn:  # Django's own tables go in it too (search_path)
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    env = {"DATABASE_URL": dsn, "BROOQ_SCHEMA": schema, "DJANGO_SETTINGS_MODULE": "project.settings"}
    os.environ.update(env)
    sys.path.insert(0, str(HERE))
    django.setup()
    call_command("migrate", verbosity=0)
    from shop.models import Order

    with connection.schema_editor() as editor:
        editor.create_model(Order)
    try:
        yield env
    finally:
        connection.close()
        drop_schema(dsn, schema)
