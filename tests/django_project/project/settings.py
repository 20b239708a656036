"""Settings of the Django test project: DATABASE_URL and BROOQ_SCHEMA come from the environment.

Django's tables and brooq's job table share the test schema (``search_path``).
"""

import os

from psycopg.conninfo import conninfo_to_dict

_db = conninfo_to_dict(os.environ["DATABASE_URL"])
SCHEMA = os.environ["BROOQ_SCHEMA"]

SECRET_KEY = "test-only"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["brooq_py.contrib.django", "shop"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.get("dbname", ""),
        "USER": _db.get("user", ""),
        "PASSWORD": _db.get("password", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
        "OPTIONS": {"options": f"-c search_path={SCHEMA}"},
    }
}
TASKS = {
    "default": {
        "BACKEND": "brooq_py.contrib.django.BrooqBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"schema": SCHEMA},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
