"""The job queue's tables: brooq_py's migrations, to head; not atomic, as they use their own connection."""

from typing import Any

from django.db import migrations


def forwards(apps: Any, schema_editor: Any) -> None:
    from brooq_py.contrib.django.queue_schema import upgrade

    upgrade(schema_editor.connection)


def backwards(apps: Any, schema_editor: Any) -> None:
    from brooq_py.contrib.django.queue_schema import downgrade

    downgrade(schema_editor.connection)


class Migration(migrations.Migration):
    atomic = False
    dependencies: list[Any] = []
    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
