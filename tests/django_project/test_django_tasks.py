"""Django 6 tasks on brooq (API "Django tasks backend"; SPEC E3, A1): enqueue inside
transaction.atomic() on Django's own connection, manage.py brooq_worker, get_result."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.polling import wait_for

HERE = Path(__file__).resolve().parent


def job_row(dsn: str, schema: str, job_id: str) -> tuple[Any, ...] | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            sql.SQL("SELECT topic, priority, state, payload FROM {} WHERE id = %s").format(
                sql.Identifier(schema, "job")
            ),
            (job_id,),
        ).fetchone()


def worker(env: dict[str, str], *args: str, **popen: Any) -> Any:
    full = {
        **os.environ,
        **env,
        "PYTHONUNBUFFERED": "1",
        "QUEUE_MAX_ATTEMPTS": "1",
        "QUEUE_POLL_INTERVAL": "200ms",
    }
    cmd = [sys.executable, str(HERE / "manage.py"), "brooq_worker", *args]
    if popen.pop("background", False):
        return subprocess.Popen(cmd, env=full, cwd=HERE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, env=full, cwd=HERE, capture_output=True, text=True, timeout=120, check=False)


def test_e3_enqueue_commits_with_the_atomic_block(
    django_env: dict[str, str], dsn: str, tmp_path: Path
) -> None:
    from django.db import transaction
    from django.tasks import TaskResultStatus
    from shop.models import Order
    from shop.tasks import record

    schema = django_env["BROOQ_SCHEMA"]
    with transaction.atomic():
        order = Order.objects.create(item="book")
        result = record.enqueue(str(tmp_path / "out"), "hello")
        assert result.status == TaskResultStatus.READY
        assert job_row(dsn, schema, result.id) is None  # not visible before commit
    row = job_row(dsn, schema, result.id)
    assert row is not None and row[0] == "default.shop.tasks.record" and row[2] == "pending"
    assert Order.objects.filter(pk=order.pk).exists()
    fetched = record.get_result(result.id)
    assert fetched.status == TaskResultStatus.READY and fetched.args == [str(tmp_path / "out"), "hello"]


def test_e3_enqueue_rolls_back_with_the_atomic_block(django_env: dict[str, str], dsn: str) -> None:
    from django.db import transaction
    from django.tasks.exceptions import TaskResultDoesNotExist
    from shop.models import Order
    from shop.tasks import record

    with pytest.raises(RuntimeError), transaction.atomic():
        Order.objects.create(item="gone")
        result = record.enqueue("/nonexistent/x", "never")
        raise RuntimeError("boom")
    assert job_row(dsn, django_env["BROOQ_SCHEMA"], result.id) is None
    assert not Order.objects.filter(item="gone").exists()
    with pytest.raises(TaskResultDoesNotExist):
        record.get_result(result.id)
    with pytest.raises(TaskResultDoesNotExist):
        record.get_result(str(uuid.uuid4()))


def test_priority_and_queue_name_are_honoured(django_env: dict[str, str], dsn: str, tmp_path: Path) -> None:
    from shop.tasks import record, send_email

    schema = django_env["BROOQ_SCHEMA"]
    mail = send_email.enqueue(str(tmp_path / "m"), "a@example.com")
    row = job_row(dsn, schema, mail.id)
    assert row is not None and row[0] == "emails.shop.tasks.send_email" and row[1] == 10
    low = record.using(priority=-5, queue_name="emails").enqueue(str(tmp_path / "r"), "x")
    row = job_row(dsn, schema, low.id)
    assert row is not None and row[0] == "emails.shop.tasks.record" and row[1] == -5
    back = record.get_result(low.id)
    assert back.task.priority == -5 and back.task.queue_name == "emails"


def test_brooq_worker_runs_tasks_and_get_result_reports_the_outcome(
    django_env: dict[str, str], dsn: str, tmp_path: Path
) -> None:
    from django.tasks import TaskResultStatus
    from shop.tasks import attempt_of, explode, record, send_email

    ok = record.enqueue(str(tmp_path / "ok"), "done it")
    mail = send_email.enqueue(str(tmp_path / "mail"), "b@example.com")
    ctx = attempt_of.enqueue(str(tmp_path / "ctx"))
    bad = explode.enqueue("kaboom")

    done = worker(django_env, "--burst")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ok").read_text() == "done it"
    assert (tmp_path / "mail").read_text() == "to b@example.com"
    assert (tmp_path / "ctx").read_text() == f"{ctx.id} attempt 1"

    result = record.get_result(ok.id)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.is_finished and result.errors == []
    assert result.return_value == "done it"  # the task's return value is the job's result (V1)
    assert send_email.get_result(mail.id).status == TaskResultStatus.SUCCESSFUL
    failed = explode.get_result(bad.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.errors[0].exception_class_path == "builtins.ValueError"
    assert failed.errors[0].exception_class is ValueError and "kaboom" in failed.errors[0].traceback
    # A real traceback (V3): the task's own frame, not one line of text.
    assert failed.errors[0].traceback.startswith("Traceback (most recent call last)")
    assert "in explode" in failed.errors[0].traceback
    ok.refresh()
    assert ok.status == TaskResultStatus.SUCCESSFUL


def test_brooq_worker_runs_until_sigterm(django_env: dict[str, str], tmp_path: Path) -> None:
    from django.tasks import TaskResultStatus
    from shop.tasks import record

    proc = worker(django_env, "--queue", "default", background=True)
    try:
        result = record.enqueue(str(tmp_path / "live"), "live")
        wait_for(
            lambda: record.get_result(result.id).status == TaskResultStatus.SUCCESSFUL, "the task to succeed"
        )
        assert (tmp_path / "live").read_text() == "live"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "stopping" in err


def test_e3_wraptx_from_django_joins_the_atomic_block(django_env: dict[str, str], dsn: str) -> None:
    """The README's Django ORM snippet: Store(None) + WrapTx.from_django() inside transaction.atomic()."""
    from django.db import connection, transaction
    from shop.models import Order

    from brooq_py.postgres import Store, WrapTx
    from brooq_py.queue import Job

    schema = django_env["BROOQ_SCHEMA"]
    store = Store(None, schema=schema)
    with transaction.atomic():
        order = Order.objects.create(item="lamp")
        tx = WrapTx.from_django()
        assert tx.psycopg is connection.connection
        kept = store.enqueue_tx(tx, Job("email.send", {"order": order.pk}))
    row = job_row(dsn, schema, kept.id)
    assert row is not None and row[3] == {"order": order.pk}
    with pytest.raises(RuntimeError), transaction.atomic():
        gone = store.enqueue_tx(WrapTx.from_django("default"), Job("email.send", {"order": 0}))
        raise RuntimeError("boom")
    assert job_row(dsn, schema, gone.id) is None


def test_e3_e2_a_savepoint_rolled_back_drops_only_its_own_enqueue(
    django_env: dict[str, str], dsn: str
) -> None:
    """A nested atomic() that rolls back takes its enqueue with it while the outer block commits; a
    duplicate key inside the block neither aborts it nor creates a second row."""
    from django.db import transaction
    from shop.models import Order
    from shop.tasks import record

    from brooq_py.postgres import Store, WrapTx
    from brooq_py.queue import Job

    schema = django_env["BROOQ_SCHEMA"]
    store = Store(None, schema=schema)
    key = f"order-{uuid.uuid4()}"
    with transaction.atomic():
        kept = record.enqueue("/nonexistent/kept", "kept")
        first = store.enqueue_tx(WrapTx.from_django(), Job("email.send", 1, idempotency_key=key))
        with pytest.raises(RuntimeError), transaction.atomic():
            gone = record.enqueue("/nonexistent/gone", "gone")
            raise RuntimeError("boom")
        again = store.enqueue_tx(WrapTx.from_django(), Job("email.send", 2, idempotency_key=key))
        Order.objects.create(item="after the duplicate")  # the transaction still works
    assert job_row(dsn, schema, kept.id) is not None
    assert job_row(dsn, schema, gone.id) is None
    assert (again.id, again.created) == (first.id, False)
    assert Order.objects.filter(item="after the duplicate").exists()


def test_burst_waits_for_a_retry_in_its_backoff(django_env: dict[str, str], tmp_path: Path) -> None:
    from django.tasks import TaskResultStatus
    from shop.tasks import flaky

    from tests.django_project.test_django_migrate import manage

    result = flaky.enqueue(str(tmp_path / "flaky"))
    retries = {"QUEUE_MAX_ATTEMPTS": "3", "QUEUE_BACKOFF_BASE": "300ms", "QUEUE_BACKOFF_MAX": "600ms"}
    done = manage(
        django_env["DATABASE_URL"],
        django_env["BROOQ_SCHEMA"],
        "brooq_worker",
        "--burst",
        "--queue",
        "default",
        extra=retries,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "flaky").read_text() == "second attempt", done.stderr
    assert flaky.get_result(result.id).status == TaskResultStatus.SUCCESSFUL
