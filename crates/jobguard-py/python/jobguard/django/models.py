"""The guard table as a Django model, for reading only: unmanaged (the migration creates the
table with the Rust core's statements, and Django never alters it) and shown by the read-only
admin page. Rows are written by the guard alone."""

from __future__ import annotations

import datetime as _dt
from typing import Any

from django.db import models

from .._guard import DEFAULT_TABLE


class AppliedAtField(models.Field):
    """``applied_at``: a ``timestamptz`` on PostgreSQL, microseconds since the Unix epoch (an
    ``integer``) on SQLite, as the Rust core creates it; read as an aware UTC ``datetime`` on
    both. Read-only: the database sets it when the key is claimed."""

    description = "when the key was first applied"

    def db_type(self, connection: Any) -> str:
        return "timestamptz" if connection.vendor == "postgresql" else "integer"

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        if value is None or isinstance(value, _dt.datetime):
            return value
        return _dt.datetime.fromtimestamp(int(value) / 1_000_000, tz=_dt.timezone.utc)


class GuardRow(models.Model):
    """One applied key: its kind, when it was first applied and the result its first
    delivery stored."""

    job_key = models.TextField(primary_key=True)
    kind = models.TextField()
    fingerprint = models.BinaryField(null=True)
    result = models.JSONField(null=True)
    claim_token = models.BinaryField()
    applied_at = AppliedAtField()

    class Meta:
        managed = False
        db_table = DEFAULT_TABLE
        ordering = ["-applied_at"]
        verbose_name = "guard row"
        verbose_name_plural = "guard rows"
        default_permissions = ("view",)

    def __str__(self) -> str:
        return str(self.job_key)
