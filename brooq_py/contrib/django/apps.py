"""The Django app: ``manage.py brooq_worker``, the queue's tables by ``manage.py migrate``, a check."""

from __future__ import annotations

from django.apps import AppConfig


class BrooqConfig(AppConfig):
    name = "brooq_py.contrib.django"
    label = "brooq_django"
    verbose_name = "brooq_py tasks"

    def ready(self) -> None:
        from django.core import checks

        from brooq_py.contrib.django.checks import queue_schema_check

        checks.register(queue_schema_check)
