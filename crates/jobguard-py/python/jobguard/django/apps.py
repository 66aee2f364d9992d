"""The Django app: ``INSTALLED_APPS = [..., "jobguard.django"]``."""

from __future__ import annotations

from django.apps import AppConfig


class JobguardConfig(AppConfig):
    """jobguard's guard table, migrated by ``python manage.py migrate``, with a read-only
    admin page."""

    name = "jobguard.django"
    label = "jobguard"
    verbose_name = "jobguard"
    default_auto_field = "django.db.models.BigAutoField"
