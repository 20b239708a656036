"""docs/django.md's Python snippets (``<!-- django-snippet: name -->``) run in the test project, as
the README's programs run in tests/integration/test_readme_snippets.py: the settings it shows, the
enqueue on Django's connection, the tasks module, its enqueue, a worker, and the stored result."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.django_project.test_django_tasks import job_row, worker

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "django.md"
SNIPPET = re.compile(r"<!-- django-snippet: ([\w-]+) -->\n```python\n(.*?)```", re.S)


def snippets() -> dict[str, str]:
    return dict(SNIPPET.findall(PAGE.read_text(encoding="utf-8")))


def test_the_page_has_its_snippets() -> None:
    assert set(snippets()) == {"place-order", "settings", "tasks", "enqueue", "result"}


def test_the_settings_snippet_names_the_backend_and_the_app(django_env: dict[str, str]) -> None:
    scope: dict[str, Any] = {}
    exec(snippets()["settings"], scope)
    assert "brooq_py.contrib.django" in scope["INSTALLED_APPS"]
    backend = scope["TASKS"]["default"]
    assert backend["BACKEND"] == "brooq_py.contrib.django.BrooqBackend"
    from django.conf import settings

    assert backend["QUEUES"] == settings.TASKS["default"]["QUEUES"]  # the test project's own


def test_place_order_enqueues_on_djangos_connection(django_env: dict[str, str], dsn: str) -> None:
    scope: dict[str, Any] = {"__name__": "docs_place_order"}
    exec(snippets()["place-order"], scope)
    job_id = scope["place_order"]("a@example.com")
    row = job_row(dsn, django_env["BROOQ_SCHEMA"], job_id)
    assert row is not None and row[0] == "email.send" and row[2] == "pending"
    from shop.models import Order

    assert Order.objects.get(pk=row[3]["order"]).email == "a@example.com"


def test_a_task_enqueued_as_the_page_shows_runs_and_its_result_is_the_return_value(
    django_env: dict[str, str], dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The tasks snippet is `shop/tasks.py` on the page; here it is a module of its own beside the
    # test project's shop app, named to the worker with --module.
    module = "docs_shop_tasks"
    (tmp_path / f"{module}.py").write_text(snippets()["tasks"], encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(module, None)
    scope: dict[str, Any] = {}
    exec(snippets()["enqueue"].replace("from shop.tasks import", f"from {module} import"), scope)
    result = scope["result"]
    row = job_row(dsn, django_env["BROOQ_SCHEMA"], result.id)
    assert row is not None and row[0] == f"emails.{module}.send_receipt" and row[2] == "pending"

    env = {**django_env, "PYTHONPATH": str(tmp_path)}
    done = worker(env, "--burst", "--queue", "emails", "--module", module)
    assert done.returncode == 0, done.stderr
    assert job_row(dsn, django_env["BROOQ_SCHEMA"], result.id)[2] == "done"  # type: ignore[index]
    exec(snippets()["result"], scope)  # its asserts: SUCCESSFUL, and the stored return value
    assert scope["done"].return_value == "receipt sent to a@example.com"


def test_brooq_worker_warns_about_pending_jobs_it_has_no_task_for(
    django_env: dict[str, str], dsn: str
) -> None:
    schema = django_env["BROOQ_SCHEMA"]
    with psycopg.connect(dsn, autocommit=True) as conn:  # the psql INSERT: a topic no task has
        (stray,) = conn.execute(
            sql.SQL("INSERT INTO {} (topic, payload) VALUES ('reports.orphan', '{{}}') RETURNING id").format(
                sql.Identifier(schema, "job")
            )
        ).fetchone()  # type: ignore[misc]
    try:
        done = worker(django_env, "--burst", "--queue", "default")
        assert done.returncode == 0, done.stderr
        assert "brooq_worker: warning: jobs of topic 'reports.orphan' are pending" in done.stderr, done.stderr
        assert "this worker has no handler for it" in done.stderr
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DELETE FROM {} WHERE id = %s").format(sql.Identifier(schema, "job")), (stray,)
            )
