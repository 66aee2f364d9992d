"""The queue's tables (``jobguard_jobs``, its indexes and the paused-queues table), created with
the Rust core's statements for the database's vendor, as ``App.migrate`` and the Rust
``Queue::migrate`` create them: on PostgreSQL under the same advisory lock and with the same
schema marker, so Django, Python workers and Rust workers may migrate in any order. Jobs are
then enqueued from Django code with ``jobguard.enqueue_sync`` or an ``App``'s job, in the
caller's ``transaction.atomic()``.

Unapplying leaves the tables: they hold jobs not yet run.
"""

from typing import Any

from django.db import migrations

from jobguard._enqueue import DEFAULT_QUEUE_TABLE
from jobguard._migrate_queue import migrate_queue_sync
from jobguard.django._driver import DjangoDriver


def create_queue_tables(apps: Any, schema_editor: Any) -> None:
    migrate_queue_sync(DjangoDriver(schema_editor.connection), table=DEFAULT_QUEUE_TABLE)


class Migration(migrations.Migration):
    dependencies = [("jobguard", "0001_initial")]

    operations = [
        migrations.RunPython(create_queue_tables, migrations.RunPython.noop, elidable=False),
    ]
