"""The job queue's tables: brooq_py's own migrations, to head, on the queue's schema(s).

Not atomic: brooq's migrations run in a transaction of their own, on their own connection.
"""

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
