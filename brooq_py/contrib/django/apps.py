"""The Django app that brings the ``brooq_worker`` management command."""

from __future__ import annotations

from django.apps import AppConfig


class BrooqConfig(AppConfig):
    name = "brooq_py.contrib.django"
    label = "brooq_django"
    verbose_name = "brooq_py tasks"
