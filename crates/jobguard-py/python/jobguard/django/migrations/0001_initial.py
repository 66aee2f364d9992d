"""The guard table, created with the Rust core's statements for the database's vendor.

``jobguard.migrate_sync`` runs them on Django's connection, in the migration's transaction: on
PostgreSQL the table, its index and its claim functions under the per-table advisory lock and
schema marker the Rust library uses (so either may migrate first); on SQLite the table and its
index. The model is unmanaged: Django only reads the table.

Unapplying leaves the table: its rows record which jobs took effect, and dropping them would
let every redelivery apply again.
"""

from typing import Any

from django.db import migrations, models

import jobguard
import jobguard.django.models
from jobguard.django._driver import DjangoDriver


def create_guard_table(apps: Any, schema_editor: Any) -> None:
    jobguard.migrate_sync(DjangoDriver(schema_editor.connection))


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.RunPython(create_guard_table, migrations.RunPython.noop, elidable=False),
        migrations.CreateModel(
            name="GuardRow",
            fields=[
                ("job_key", models.TextField(primary_key=True, serialize=False)),
                ("kind", models.TextField()),
                ("fingerprint", models.BinaryField(null=True)),
                ("result", models.JSONField(null=True)),
                ("claim_token", models.BinaryField()),
                ("applied_at", jobguard.django.models.AppliedAtField()),
            ],
            options={
                "verbose_name": "guard row",
                "verbose_name_plural": "guard rows",
                "db_table": "processed_jobs",
                "ordering": ["-applied_at"],
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
    ]
