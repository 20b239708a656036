"""brooq_py for Django 6's task framework (``django.tasks``); the extra ``brooq_py[django]``.

Settings::

    INSTALLED_APPS = [..., "brooq_py.contrib.django"]       # for `manage.py brooq_worker`
    TASKS = {"default": {"BACKEND": "brooq_py.contrib.django.BrooqBackend",
                         "OPTIONS": {"schema": "public"}}}

``BrooqBackend`` is imported lazily, so listing the app never imports the task
framework before Django's apps are ready.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from brooq_py.contrib.django.backend import BrooqBackend

__all__ = ["BrooqBackend"]


def __getattr__(name: str) -> Any:
    if name == "BrooqBackend":
        from brooq_py.contrib.django.backend import BrooqBackend

        return BrooqBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
